"""The drafter's output head: the target's lm_head restricted to the draft vocabulary (:class:`DraftHead`),
the top-1 drafts of a block and the drafter's probability of any token (:class:`BlockScorer`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ..kernels import PackedLinear, can_pack, pack_weight, packed_linear, use_packed


class DraftHead:
    """The target's lm_head restricted to the drafter's draft vocabulary (all rows when it has none).

    FR-Spec / EAGLE-3: most of the output mass sits on a small share of the vocabulary, and the lm_head
    is the drafter's main cost. Verification always uses the full vocabulary, so this stays lossless.
    The sliced weight is copied once per generation call (and packed for oneDNN where the target's own
    lm_head is, :mod:`adaflash_hf.kernels`).
    """

    def __init__(self, lm_head: torch.nn.Module, vocab: torch.Tensor | None):
        self.vocab = vocab
        self.weight = (
            lm_head.weight if vocab is None else lm_head.weight.index_select(0, vocab.to(lm_head.weight.device))
        )
        self.bias = (
            None
            if getattr(lm_head, "bias", None) is None
            else (lm_head.bias if vocab is None else lm_head.bias.index_select(0, vocab.to(lm_head.bias.device)))
        )
        self.packed = None
        if isinstance(lm_head, PackedLinear) and can_pack(self.weight):  # the full head is packed already: share it
            self.packed = lm_head._fresh_packed() if vocab is None else pack_weight(self.weight)
        vocab_size, device = lm_head.weight.shape[0], lm_head.weight.device
        draft_ids = torch.arange(vocab_size, device=device) if vocab is None else vocab.to(device)
        self._index = torch.full(
            (vocab_size,), -1, dtype=torch.long, device=device
        ).index_copy_(  # target id -> draft index
            0, draft_ids, torch.arange(draft_ids.numel(), device=device)
        )

    def logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., V_draft) logits over the draft vocabulary."""
        # As a 2-D (rows, H) matmul: a sliced 3-D input such as hidden[:, 1:] keeps a non-standard stride
        # on its size-1 batch dim, which sends CPU bf16 matmuls down a path ~15x slower (measured).
        flat = hidden_states.reshape(-1, hidden_states.shape[-1])
        if self.packed is not None and use_packed(flat, self.weight):
            return packed_linear(flat, self.packed, self.bias).view(*hidden_states.shape[:-1], -1)
        return F.linear(flat, self.weight, self.bias).view(*hidden_states.shape[:-1], -1)

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids if self.vocab is None else self.vocab.to(draft_ids.device)[draft_ids]

    def scorer(self, logits: torch.Tensor) -> BlockScorer:
        """The drafter's probability of any tokens of a block with draft logits (b, g, V_draft)."""
        return BlockScorer(logits, self._index)

    def to_target_probs(self, probs: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """(..., V_draft) probabilities -> (..., vocab_size), zero outside the draft vocabulary."""
        if self.vocab is None:
            return probs
        full = probs.new_zeros(*probs.shape[:-1], vocab_size)
        return full.index_copy_(-1, self.vocab.to(probs.device), probs)


class BlockScorer:
    """``scorer(queries)``: for each query ``(row, tokens)`` the drafter's probability of ``tokens[j]`` at block
    position j + 1 (0 outside the draft vocabulary, None past the block); one gather answers all queries of a
    round. logits (b, g, V_draft) of the block; draft_index (V,) each target id's draft-vocabulary index, -1
    outside it."""

    def __init__(self, logits: torch.Tensor, draft_index: torch.Tensor):
        self.logits, self.draft_index = logits, draft_index
        self.normaliser: torch.Tensor | None = None  # log-normaliser (b, g), computed on the first query

    def __call__(self, queries: Sequence[tuple[int, Sequence[int]]]) -> list[list[float | None]]:
        logits, width = self.logits, self.logits.shape[1]
        rows, positions, ids, sizes = [], [], [], []
        for row, tokens in queries:
            j = min(len(tokens), width)
            rows += [row] * j
            positions += range(j)
            ids += tokens[:j]
            sizes.append((j, len(tokens)))
        flat: list[float] = []
        if ids:
            if self.normaliser is None:
                self.normaliser = torch.logsumexp(logits.float(), dim=-1)
            r, p = torch.tensor(rows, device=logits.device), torch.tensor(positions, device=logits.device)
            index = self.draft_index[torch.tensor(ids, device=logits.device)]
            log_probs = logits[r, p, index.clamp_min(0)].float() - self.normaliser[r, p]
            flat = (log_probs.exp() * (index >= 0)).tolist()
        out, start = [], 0
        for j, n in sizes:
            out.append(flat[start : start + j] + [None] * (n - j))
            start += j
        return out


def top_probs_and_tokens(
    head: DraftHead, hidden_states: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Drafter hidden states (b, g, H) -> (target ids (b, g), top-1 probabilities (b, g), draft-vocab logits
    (b, g, V_d))."""
    logits = head.logits(hidden_states)
    top_logit, top_index = logits.max(-1)
    top_prob = torch.exp(top_logit.float() - torch.logsumexp(logits.float(), dim=-1))
    return head.to_target_ids(top_index), top_prob, logits
