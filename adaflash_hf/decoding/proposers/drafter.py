"""The learned block-diffusion drafter as a draft source: one pass over ``[anchor, MASK x (B-1)]`` per row
drafts a block (:class:`DrafterProposer`), reading the target features it has not read yet.

The drafter keeps its own layout: its cache (b, draft slots) with ``draft_mask``, and the target features
it has not read yet in :class:`PendingContext`, which it reads the next time it runs. Its layout is joined,
compacted and trimmed apart from the target's, so rounds that skip the drafter cost what a plain batched step
costs: the unread features are only collected.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import torch

from ..._compat import engine_attention
from ..cost import timer
from ..draft_head import DraftHead, top_probs_and_tokens
from ..kv_cache import COMPACT_FRACTION, RaggedCache, append_rows, is_initialized, move_rows, pack_cache
from .base import Candidate

logger = logging.getLogger(__name__)


def context_features(hidden_states: tuple[torch.Tensor, ...], layer_ids: list[int]) -> torch.Tensor:
    """Concatenate the selected target layers: hidden_states[i + 1] is layer i's output -> (b, T, n*H)."""
    return torch.cat([hidden_states[i + 1] for i in layer_ids], dim=-1)


def draft_block(drafter, embed, anchors, context, context_pos, anchor_pos, key_mask, cache) -> torch.Tensor:
    """One drafter pass over ``[anchor, MASK x (B-1)]`` per row; returns (b, B, H) hidden states.

    anchors (b,) newest tokens; context (b, s, n*H) target features not yet in the drafter cache, at
    positions context_pos (b, s); anchor_pos (b,) the anchors' positions; key_mask (b, cached + s)
    marks valid context slots. The block's keys/values are cropped back off ``cache`` afterwards.
    """
    block_size = drafter.config.block_size
    block_ids = torch.full(
        (anchors.shape[0], block_size), drafter.config.mask_token_id, dtype=torch.long, device=anchors.device
    )
    block_ids[:, 0] = anchors
    block_pos = anchor_pos[:, None] + torch.arange(block_size, device=anchors.device)
    with engine_attention(anchors.device, block_size):
        out = drafter(
            noise_embeds=embed(block_ids),
            context_hidden_states=context,
            position_ids=torch.cat([context_pos, block_pos], dim=1),
            attention_mask=torch.cat([key_mask, torch.ones_like(block_ids)], dim=1),
            cache=cache,
        )
    cache.crop(-block_size)  # keep the context, drop the block
    return out.last_hidden_state


def catch_up_seconds(seconds: float, read: int, fresh: int, block: int) -> float:
    """The part of a drafter pass spent catching up: the pass read ``read`` context tokens and drafted ``block``, and a
    drafter that ran every round would have read only the last round's ``fresh`` tokens. The rest (rounds that skipped
    the drafter, prompts of new rows) is a one-off cost of resuming speculation; by its share of the pass's tokens it is
    kept out of the round time the policy judges speculation by, or a long hold of plain steps would make the round that
    ends it look dearer the longer the hold was."""
    return seconds * max(read - fresh, 0) / max(read + block, 1)


class PendingContext:
    """Target features the drafter has not read yet, per row: chunks of (n, n*H) features and (n,) positions.

    Only accepted slots are kept (no holes), and each row's chunks live apart from the others', so rows
    join and leave without touching anyone else's context. A round in which every row kept only its anchor
    (a held round: plain steps) adds one batch-wide chunk (:meth:`add_batch`) that is split per row only when the
    context is read or the batch changes, so holding costs no per-row work. :meth:`take` lays the chunks out for
    the drafter when it runs. Past ``max_width`` tokens a row's pass reads only its newest (the drafter then misses
    that far context; outputs are unchanged); older chunks are dropped once a row holds twice that many, so a long
    hold neither grows without bound nor copies the kept context every round.
    """

    def __init__(self, max_width: int = 1024):
        self.rows: dict[Hashable, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.widths: dict[Hashable, int] = {}  # unread tokens per row
        self.max_width = max_width
        self._held: list[tuple[torch.Tensor, torch.Tensor]] = []  # batch-wide chunks: (b, n*H) features, (b,) positions
        self._held_rows: tuple[Hashable, ...] = ()  # the rows of every chunk in ``_held``, in order

    def add(self, row: Hashable, hidden: torch.Tensor, pos: torch.Tensor) -> None:
        """Append (n, n*H) features at positions (n,) to ``row``'s unread context."""
        self._split_held()
        self._append(row, hidden, pos)

    def add_batch(self, rows: Sequence[Hashable], hidden: torch.Tensor, pos: torch.Tensor) -> None:
        """Append one token to the unread context of every row of ``rows``: (b, n*H) features at positions (b,).
        Kept whole until read, so the round pays for no per-row slicing."""
        rows = tuple(rows)
        if self._held and rows != self._held_rows:
            self._split_held()
        self._held_rows = rows
        self._held.append((hidden, pos))

    def drop(self, row: Hashable) -> None:
        self._split_held()
        self.rows.pop(row, None)
        self.widths.pop(row, None)

    def take(
        self, rows: Sequence[Hashable], size: int, like: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The unread context of ``rows`` (each row's newest ``max_width`` tokens), left-padded: (b, s, size)
        features, (b, s) positions, (b, s) 0/1 mask; it is then read (emptied). ``like`` gives the features'
        dtype and device."""
        self._split_held()
        joined = [
            tuple(torch.cat(parts)[-self.max_width :] for parts in zip(*self.rows[row])) if self.rows.get(row) else None
            for row in rows
        ]
        width = max((len(j[1]) for j in joined if j is not None), default=0)
        hidden = like.new_zeros((len(rows), width, size))
        pos = torch.zeros((len(rows), width), dtype=torch.long, device=like.device)
        mask = torch.zeros_like(pos)
        for i, j in enumerate(joined):
            if j is not None and len(j[1]):
                n = len(j[1])
                hidden[i, width - n :], pos[i, width - n :], mask[i, width - n :] = j[0], j[1], 1
        self.rows, self.widths = {row: [] for row in rows}, {row: 0 for row in rows}
        return hidden, pos, mask

    def _append(self, row: Hashable, hidden: torch.Tensor, pos: torch.Tensor) -> None:
        self.rows.setdefault(row, []).append((hidden, pos))
        self.widths[row] = self.widths.get(row, 0) + len(pos)
        if self.widths[row] > 2 * self.max_width:  # amortised: one copy per max_width tokens, not one per round
            hidden, pos = (torch.cat(parts)[-self.max_width :] for parts in zip(*self.rows[row]))
            self.rows[row], self.widths[row] = [(hidden, pos)], self.max_width

    def _split_held(self) -> None:
        """Hand the batch-wide chunks to their rows: one stack, then a view per row."""
        if not self._held:
            return
        hidden = torch.stack([h for h, _ in self._held], dim=1)  # (b, k, n*H)
        pos = torch.stack([p for _, p in self._held], dim=1)  # (b, k)
        rows, self._held, self._held_rows = self._held_rows, [], ()
        for i, row in enumerate(rows):
            self._append(row, hidden[i], pos[i])


def drafter_bucket(prob: float | None) -> str:
    """The drafter's opinion of a look-up candidate's token at its position, as a feature entry: ``"q0"``
    (under 1 %) .. ``"q3"`` (50 % or more), ``"q-"`` past the drafter's block (a string, so it never reads as
    a runner-up's rank)."""
    if prob is None:
        return "q-"
    return f"q{3 if prob >= 0.5 else 2 if prob >= 0.1 else 1 if prob >= 0.01 else 0}"


def drafter_feature(position: int, top_prob: float) -> tuple[int, int]:
    """Feature of a drafter token: its block position and its top-1 probability in fifths."""
    return position, min(int(top_prob * 5), 4)


@dataclass
class DrafterBlock:
    """A drafter pass of one round: its drafts as target ids (b, n) and their top-1 probabilities (b, n), a
    scorer of any tokens (:class:`~..draft_head.BlockScorer`), the draft-vocabulary logits (b, n, V_draft) and
    hidden states (b, B, H) (the length head reads them), the pass's seconds and the part of them spent
    catching up on context held back (:func:`catch_up_seconds`). ``failed``: rows whose drafts are unusable
    (the pass raised, or gave them non-finite probabilities); they take a plain step this round."""

    tokens: torch.Tensor
    top_probs: torch.Tensor
    scorer: Callable[[Sequence[tuple[int, Sequence[int]]]], list[list[float | None]]] | None = None
    logits: torch.Tensor | None = None
    hidden: torch.Tensor | None = None
    seconds: float = 0.0
    catch_up: float = 0.0
    failed: list[int] = field(default_factory=list)

    def candidates(self, limit: int) -> list[Candidate | None]:
        """Every row's block, cut to ``limit`` drafts, with each token's acceptance feature; None for failed rows."""
        tokens, probs, failed = self.tokens[:, :limit].tolist(), self.top_probs[:, :limit].tolist(), set(self.failed)
        return [
            None
            if i in failed
            else Candidate("drafter", row_tokens, [drafter_feature(k, p) for k, p in enumerate(row_probs)])
            for i, (row_tokens, row_probs) in enumerate(zip(tokens, probs))
        ]


class DrafterProposer:
    """Runs the drafter for a batch and keeps its side of the batch's layout: its cache (b, draft slots), the
    0/1 ``draft_mask`` of the slots holding context, and the target features not read yet (``pending``)."""

    def __init__(self, drafter, target: torch.nn.Module):
        self.drafter = drafter
        self.block_size = drafter.config.block_size
        self.layer_ids = drafter.config.target_layer_ids
        self.hidden_request = [i + 1 for i in self.layer_ids]  # the target's hidden states the drafter reads
        self.embed = target.get_input_embeddings()
        self.feature_size = len(self.layer_ids) * self.embed.weight.shape[1]  # n*H
        self.head = DraftHead(target.get_output_embeddings(), drafter.draft_vocab)
        self.device = next(target.parameters()).device
        self.reset()

    def reset(self) -> None:
        """Forget every row (the batch emptied)."""
        self.cache = RaggedCache()
        self.draft_mask = torch.zeros(0, 0, dtype=torch.long, device=self.device)
        self.pending: PendingContext | None = None
        self.fresh_context = 0  # context tokens the last round left unread: what a drafter that runs every round reads

    def features(self, hidden_states: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """The target features (b, T, n*H) the drafter reads, from a forward's hidden states."""
        return context_features(hidden_states, self.layer_ids)

    def join(
        self, row_ids: Sequence[Hashable], features: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor
    ) -> None:
        """New rows: all holes in the drafter cache; their prompt features (the valid slots of the left-padded
        prefill: features (b, W, n*H), positions and 0/1 mask (b, W)) become unread context."""
        if self.pending is None:  # the batch was empty
            self.cache, self.pending = RaggedCache(), PendingContext()
            self.draft_mask = mask.long().new_zeros(len(row_ids), 0)
        else:
            if is_initialized(self.cache):
                append_rows(self.cache, len(row_ids))
            holes = self.draft_mask.new_zeros(len(row_ids), self.draft_mask.shape[1])
            self.draft_mask = torch.cat([self.draft_mask, holes])
        for i, row in enumerate(row_ids):
            n = int(mask[i].sum())
            self.pending.add(row, features[i, -n:], positions[i, -n:])

    def drop(self, gone: set, index: torch.Tensor, holes: list[int], movers: list[int], size: int) -> None:
        """Rows ``gone`` leave; the batch keeps rows ``index`` (the survivors past ``size`` moved into ``holes``)."""
        self.draft_mask = self.draft_mask.index_select(0, index)
        for row in gone:
            self.pending.drop(row)
        move_rows(self.cache, holes, movers, size)

    def compact(self, force: bool, min_slots: int, min_fraction: float = COMPACT_FRACTION) -> None:
        if is_initialized(self.cache):
            self.draft_mask = pack_cache(self.cache, self.draft_mask, force, min_slots, min_fraction)

    def propose(
        self, row_ids: Sequence[Hashable], anchors: torch.Tensor, anchor_pos: torch.Tensor, max_len: int | None
    ) -> DrafterBlock:
        """Draft a block for every row after its anchor (b,) at anchor_pos (b,), reading its unread context;
        the draft head runs over at most ``max_len`` drafts (None: the whole block)."""
        tick = timer(self.device)
        context, context_pos, context_mask = self.pending.take(row_ids, self.feature_size, self.embed.weight)
        key_mask = torch.cat([self.draft_mask, context_mask], dim=1)
        try:
            hidden = draft_block(
                self.drafter, self.embed, anchors, context, context_pos, anchor_pos, key_mask, self.cache
            )
            # the anchor and the drafts a row can verify
            positions = hidden.shape[1] if max_len is None else max(max_len + 1, 2)
            tokens, top_probs, logits = top_probs_and_tokens(self.head, hidden[:, 1:positions])
        except Exception:  # a failing drafter costs its rows their drafts this round, never the request
            logger.warning("The drafter failed this round; its %d rows take a plain step.", len(row_ids), exc_info=True)
            self._restart(row_ids, context, context_pos, context_mask)
            empty = anchors.new_zeros(len(row_ids), 0)
            return DrafterBlock(
                empty, empty.float(), seconds=timer(self.device) - tick, failed=list(range(len(row_ids)))
            )
        self.draft_mask = key_mask  # the drafter read the unread context into its cache
        seconds = timer(self.device) - tick
        catch_up = catch_up_seconds(
            seconds, int(context_mask.sum()), self.fresh_context, hidden.shape[0] * hidden.shape[1]
        )
        failed = (~torch.isfinite(top_probs).all(-1)).nonzero().flatten().tolist()
        if failed:
            logger.warning("The drafter gave non-finite probabilities to %d rows; they take a plain step.", len(failed))
        return DrafterBlock(tokens, top_probs, self.head.scorer(logits), logits, hidden, seconds, catch_up, failed)

    def _restart(
        self, row_ids: Sequence[Hashable], context: torch.Tensor, context_pos: torch.Tensor, context_mask: torch.Tensor
    ) -> None:
        """After a pass that raised part-way (its cache may hold some layers' block): an empty drafter cache, and the
        context the pass took back as unread. Older context is lost, which costs acceptance, not exactness."""
        self.cache = RaggedCache()
        self.draft_mask = self.draft_mask.new_zeros(len(row_ids), 0)
        for i, row in enumerate(row_ids):
            valid = context_mask[i].bool()
            self.pending.add(row, context[i, valid], context_pos[i, valid])

    def commit(
        self,
        row_ids: Sequence[Hashable],
        features: torch.Tensor,
        positions: torch.Tensor,
        slots: list[list[int]],
        chain: bool,
    ) -> None:
        """The round's accepted slots (per row, of the verify features (b, g + 1, n*H) at positions (b, g + 1)) wait
        for the drafter's next pass; a chain's accepted slots are a prefix."""
        self.fresh_context = sum(map(len, slots))
        if self.fresh_context == len(slots):  # every row kept only its anchor (a held round): one batch-wide chunk
            self.pending.add_batch(row_ids, features[:, 0], positions[:, 0])
            return
        for i, (row, index) in enumerate(zip(row_ids, slots)):
            taken = slice(0, len(index)) if chain else index
            self.pending.add(row, features[i, taken], positions[i, taken])
