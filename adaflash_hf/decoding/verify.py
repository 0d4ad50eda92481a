"""One round's verification and acceptance as functions over tensors: the verify forward's inputs for a chain
or a draft tree (padded, or packed "ragged" so the linear layers see only real tokens), per-row acceptance
(greedy or rejection sampling, each row with its own sampling parameters) and where accepted drafts came from.

Shapes: ``b`` rows, ``g`` draft slots verified after each row's anchor, ``S`` cached slots, ``V`` vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._compat import RaggedLayout
from .config import NONE
from .draft_tree import tree_accept, tree_attention_mask
from .proposers.base import Proposal
from .sampling import SamplingParams, greedy_accept, logits_to_probs, rejection_accept, sample


@dataclass
class Drafts:
    """The drafts a round verifies: draft_tokens (b, g) and num_drafts (b,) on the batch's device; parents and
    depths (b, g) for a tree (None for chains); draft_probs (b, g, V) for sampled drafter drafts (else None)."""

    draft_tokens: torch.Tensor
    num_drafts: torch.Tensor
    parents: torch.Tensor | None
    depths: torch.Tensor | None
    draft_probs: torch.Tensor | None


@dataclass
class VerifyOutput:
    """The verify forward's target_logits (b, g + 1, V) and drafter features (b, g + 1, n*H) or None, in the
    padded layout; position_ids (b, g + 1); num_tokens the tokens it carried; ``ragged``: packed into one row."""

    target_logits: torch.Tensor
    features: torch.Tensor | None
    position_ids: torch.Tensor
    num_tokens: int
    ragged: bool


@dataclass
class VerifyInputs:
    """The verify forward's input_ids (b, g + 1) and position_ids (b, g + 1) in the padded layout, its
    attention_mask ((b, S + g + 1) 0/1, or a (b, 1, g + 1, S + g + 1) additive mask for trees and ragged
    chains), and the packing ``layout`` when it runs ragged (None: padded)."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    layout: RaggedLayout | None


def verify_inputs(
    last_token: torch.Tensor,
    next_pos: torch.Tensor,
    slot_mask: torch.Tensor,
    draft_tokens: torch.Tensor,
    parents: torch.Tensor | None,
    depths: torch.Tensor | None,
    num_drafts: torch.Tensor,
    ragged: bool,
    dtype: torch.dtype,
) -> VerifyInputs:
    """[anchor, drafts] for every row: last_token (b,) at next_pos (b,), draft_tokens (b, g); a tree's nodes
    (parents and depths (b, g), :mod:`.draft_tree`) see only their ancestors. ``ragged``: pack the rows' num_drafts
    (b,) + 1 real tokens into one row; attention still runs per row over the padded layout."""
    b, g = draft_tokens.shape
    device = draft_tokens.device
    input_ids = torch.cat([last_token[:, None], draft_tokens], dim=1)  # (b, g + 1)
    if parents is None:
        position_ids = next_pos[:, None] + torch.arange(g + 1, device=device)
        if ragged:  # a chain is a tree whose node j's parent is slot j
            chain = torch.arange(g, device=device)[None].expand(b, -1)
            attention_mask = tree_attention_mask(slot_mask, chain, dtype)
        else:
            attention_mask = torch.cat([slot_mask, torch.ones_like(input_ids)], dim=1)  # (b, S + g + 1)
    else:
        position_ids = next_pos[:, None] + torch.cat([torch.zeros_like(depths[:, :1]), depths], dim=1)
        attention_mask = tree_attention_mask(slot_mask, parents, dtype)  # (b, 1, g + 1, S + g + 1)
    layout = RaggedLayout.from_lengths(num_drafts + 1, g + 1) if ragged else None
    return VerifyInputs(input_ids, position_ids, attention_mask, layout)


def choose_tokens(
    logits: torch.Tensor, params: list[SamplingParams], generator: torch.Generator | None
) -> torch.Tensor:
    """(b, V) logits -> (b,) next tokens, each row with its own sampling parameters."""
    tokens = logits.max(-1).indices
    for i, p in enumerate(params):
        if p.do_sample:
            tokens[i] = sample(logits_to_probs(logits[i], p), generator)
    return tokens


def accept_rows(
    draft_tokens: torch.Tensor,
    logits: torch.Tensor,
    num_drafts: torch.Tensor,
    draft_probs: torch.Tensor | None,
    params: list[SamplingParams],
    sampled: list[int],
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy acceptance for greedy rows, rejection sampling for the ``sampled`` rows (each with its own params).

    draft_tokens (b, g), logits (b, g + 1, V), num_drafts (b,), draft_probs (b, g, V) or None (one-hot drafts)
    -> accept_lengths (b,), next_tokens (b,)."""
    if not sampled:
        return greedy_accept(draft_tokens, logits, num_drafts)
    accept_lengths, next_tokens = greedy_accept(draft_tokens, logits, num_drafts)
    index = torch.tensor(sampled, device=logits.device)
    probs = torch.stack([logits_to_probs(logits[i], params[i]) for i in sampled])
    lengths, tokens = rejection_accept(
        draft_tokens[index], probs, num_drafts[index], None if draft_probs is None else draft_probs[index], generator
    )
    accept_lengths[index], next_tokens[index] = lengths, tokens
    return accept_lengths, next_tokens


def path_sources(proposal: Proposal, paths: list[list[int]], num_drafts: list[int]) -> list[str]:
    """Where each row's accepted drafts came from: the source of its deepest accepted node (of its
    best node when it accepted none); "none" for a row that verified no drafts."""
    if proposal.node_sources is None:
        return [s if n else NONE for s, n in zip(proposal.sources, num_drafts)]
    deepest = [path[-1] if path else 1 for path in paths]  # slot of the deepest accepted node, else of the best node
    return [nodes[slot - 1] if n else NONE for nodes, slot, n in zip(proposal.node_sources, deepest, num_drafts)]


def sample_drafter_rows(
    sources: list[str],
    draft_tokens: torch.Tensor,
    draft_logits: torch.Tensor | None,
    params: list[SamplingParams],
    head,
    vocab_size: int,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sampled drafts for sampled rows that took the drafter's block; one-hot q elsewhere.

    Returns draft_tokens (b, g) and draft_probs (b, g, V) over the target vocabulary, so that rejection
    sampling with min(1, p/q) stays exact for every row. ``head``: the :class:`~.draft_head.DraftHead`
    that maps draft_logits (b, g', V_draft) to the target vocabulary.
    """
    g = draft_tokens.shape[1]
    draft_probs = torch.zeros(*draft_tokens.shape, vocab_size, device=draft_tokens.device)
    draft_probs.scatter_(-1, draft_tokens[..., None], 1.0)
    if draft_logits is None:
        return draft_tokens, draft_probs
    draft_tokens = draft_tokens.clone()
    for i, (source, p) in enumerate(zip(sources, params)):
        if source == "drafter" and p.do_sample:
            q = head.to_target_probs(logits_to_probs(draft_logits[i, :g], p), vocab_size)
            draft_tokens[i] = sample(q, generator)
            draft_probs[i] = q
    return draft_tokens, draft_probs


def accept(
    drafts: Drafts,
    target_logits: torch.Tensor,
    params: list[SamplingParams],
    sampled: list[int],
    generator: torch.Generator | None,
) -> tuple[list[list[int]], torch.Tensor, torch.Tensor]:
    """Per-row acceptance of a chain or a tree -> paths (per row, the accepted verify slots after the anchor),
    accept_lengths (b,), next_tokens (b,)."""
    if drafts.parents is None:
        accept_lengths, next_tokens = accept_rows(
            drafts.draft_tokens, target_logits, drafts.num_drafts, drafts.draft_probs, params, sampled, generator
        )
        return [list(range(1, n + 1)) for n in accept_lengths.tolist()], accept_lengths, next_tokens
    paths, next_tokens = tree_accept(
        drafts.draft_tokens, drafts.parents, target_logits, drafts.num_drafts, params, generator
    )
    return paths, torch.tensor([len(p) for p in paths], device=drafts.num_drafts.device), next_tokens


def unpacked(
    layout: RaggedLayout | None, logits: torch.Tensor, features: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A ragged forward's (1, T, ...) outputs in the padded (b, g + 1, ...) layout; padded ones as they are."""
    if layout is None:
        return logits, features
    return layout.unpack(logits), None if features is None else layout.unpack(features)
