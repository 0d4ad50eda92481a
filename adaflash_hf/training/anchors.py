"""Anchors and the block layout of the drafter's training forward.

A training sequence of length L gives A blocks: block j is ``[token at a_j, MASK x (B-1)]`` at
absolute positions a_j..a_j+B-1. Its queries see the context (target features) strictly before a_j,
every position of their own block (bidirectional) and nothing of other blocks; block position k
predicts the token at a_j + k. This reproduces, for every block at once, what the inference engine
sees in one round (context < anchor in the drafter cache, then the block).

Conventions: ``label_mask`` (b, L) is True where the token at that position is a supervised target
prediction (response tokens; every real token after the first for corpus text); ``labels`` (b, L)
holds the target's greedy token at each position (``labels[:, t]`` = argmax of the target's logits at
t - 1). Anchors are sorted; rows with fewer candidates than A carry invalid (masked) anchors.
"""

from __future__ import annotations

import torch


def sample_anchors(
    label_mask: torch.Tensor, num_anchors: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw up to ``num_anchors`` distinct anchors per row, uniformly among valid positions.

    A position a is a candidate when ``label_mask[a]`` and ``label_mask[a + 1]``: the anchor is itself
    a response token (as at inference, where the anchor is the target's own last token) and the block's
    first prediction has a label. Returns ``anchors`` (b, A) long, sorted per row, and ``anchor_valid``
    (b, A) bool; invalid slots hold position 0 and must be ignored.
    """
    if num_anchors < 1:
        raise ValueError(f"num_anchors must be >= 1, got {num_anchors}.")
    mask = label_mask.bool()
    candidates = mask[:, :-1] & mask[:, 1:]  # (b, L-1): anchor at a needs a label at a + 1
    b = mask.shape[0]
    anchors = torch.zeros(b, num_anchors, dtype=torch.long)
    valid = torch.zeros(b, num_anchors, dtype=torch.bool)
    for row in range(b):
        positions = candidates[row].nonzero().flatten().cpu()
        chosen = positions[torch.randperm(len(positions), generator=generator)[:num_anchors]].sort().values
        anchors[row, : len(chosen)] = chosen
        valid[row, : len(chosen)] = True
    return anchors.to(label_mask.device), valid.to(label_mask.device)


def block_position_ids(anchors: torch.Tensor, block_size: int) -> torch.Tensor:
    """(b, A) anchors -> (b, A * B) absolute positions a_j + k, blocks concatenated."""
    offsets = torch.arange(block_size, device=anchors.device)
    return (anchors[:, :, None] + offsets).flatten(1)  # (b, A, B) -> (b, A * B)


def block_input_ids(
    input_ids: torch.Tensor, anchors: torch.Tensor, block_size: int, mask_token_id: int
) -> torch.Tensor:
    """(b, L) tokens, (b, A) anchors -> (b, A * B) block tokens ``[token at a_j, MASK x (B - 1)]``."""
    b, num_anchors = anchors.shape
    blocks = torch.full((b, num_anchors, block_size), mask_token_id, dtype=input_ids.dtype, device=input_ids.device)
    blocks[:, :, 0] = input_ids.gather(1, anchors)
    return blocks.flatten(1)  # (b, A * B)


def block_attention_mask(
    anchors: torch.Tensor, context_len: int, block_size: int, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Additive mask (b, 1, A * B, L + A * B): 0 where visible, dtype-min where hidden.

    Block j's queries see context positions p < a_j and the B keys of block j; nothing else.
    """
    b, num_anchors = anchors.shape
    device = anchors.device
    q_block = torch.arange(num_anchors, device=device).repeat_interleave(block_size)  # (A * B,) block of each query
    q_anchor = anchors[:, q_block]  # (b, A * B)
    context_visible = torch.arange(context_len, device=device)[None, None, :] < q_anchor[:, :, None]  # (b, A*B, L)
    block_visible = (q_block[:, None] == q_block[None, :]).expand(b, -1, -1)  # (b, A*B, A*B)
    visible = torch.cat([context_visible, block_visible], dim=-1)[:, None]  # (b, 1, A*B, L + A*B)
    return torch.zeros(visible.shape, dtype=dtype, device=device).masked_fill(~visible, torch.finfo(dtype).min)


def block_labels(
    labels: torch.Tensor,
    label_mask: torch.Tensor,
    anchors: torch.Tensor,
    anchor_valid: torch.Tensor,
    block_size: int,
    input_ids: torch.Tensor | None = None,
    ignore_index: int = -100,
) -> torch.Tensor:
    """Labels of block positions k = 1..B-1: (b, A, B - 1), ``ignore_index`` where none exists.

    Position k of block j is labelled ``labels[a_j + k]`` when that position is in ``label_mask``.
    With ``input_ids`` given (teacher-forced text), position k is kept only while the text agrees with
    the target's greedy tokens at a_j + 1 .. a_j + k - 1: verification reaches position k only after
    accepting those greedy tokens, so a label conditioned on a different prefix would teach a
    continuation that inference never asks for.
    """
    b, seq_len = labels.shape
    offsets = torch.arange(1, block_size, device=labels.device)
    positions = anchors[:, :, None] + offsets  # (b, A, B-1)
    inside = positions < seq_len
    positions = positions.clamp_max(seq_len - 1)
    gathered = labels.gather(1, positions.flatten(1)).view(positions.shape)  # (b, A, B-1)
    keep = inside & label_mask.bool().gather(1, positions.flatten(1)).view(positions.shape) & anchor_valid[:, :, None]
    if input_ids is not None:
        agree = (input_ids == labels).gather(1, positions.flatten(1)).view(positions.shape)  # (b, A, B-1)
        # position k needs agreement at positions 1..k-1: shift right by one, then a running AND
        prefix = torch.cat([torch.ones_like(agree[:, :, :1]), agree[:, :, :-1]], dim=-1)
        keep &= prefix.long().cumprod(-1).bool()
    return gathered.masked_fill(~keep, ignore_index)
