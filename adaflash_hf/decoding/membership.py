"""Rows joining and leaving a :class:`~.state.SpeculativeBatch` between rounds: prefill, merge, drop, compaction.

Joining rows are prefilled on their own (ragged where the target allows it) and merged right-aligned into the
target's cache (holes on the left); leaving rows are swap-removed so the caches copy only the rows that move.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

import torch

from .._compat import CACHE_KWARG, RaggedLayout, ragged_forward, sdpa_gqa
from .cost import timer
from .kv_cache import RaggedCache, move_rows, pack_cache, relayout_cache, shifted_index, take_slots
from .verify import choose_tokens

if TYPE_CHECKING:
    from .state import RowSpec, RowUpdate


class BatchMembership:
    """The add / drop half of :class:`~.state.SpeculativeBatch`: rows join and leave between rounds."""

    @torch.inference_mode()
    def add_rows(self, specs: Sequence[RowSpec]) -> list[RowUpdate]:
        """Prefill new rows (one batched target forward) and merge them into the batch.

        Returns each new row's first token. Rows that finish on it (a stop id, or a budget of one
        token) are not kept.
        """
        if not specs:
            return []
        clash = [s.row_id for s in specs if s.row_id in self.specs] + [
            s.row_id for i, s in enumerate(specs) if s.row_id in {t.row_id for t in specs[:i]}
        ]
        if clash:
            raise ValueError(f"row ids {clash} are already in the batch; give each row a unique id.")
        for spec in specs:
            if spec.max_new_tokens < 1 or not len(spec.prompt_ids):
                raise ValueError(f"row {spec.row_id!r}: needs a non-empty prompt and max_new_tokens >= 1.")
        start = timer(self.device)
        cache, attention_mask, position_ids, last_logits, pending = self._prefill([list(s.prompt_ids) for s in specs])
        first = choose_tokens(last_logits, [s.params for s in specs], self.generator)
        self._merge(specs, cache, attention_mask, position_ids[:, -1] + 1, first, pending, position_ids)
        seconds = timer(self.device) - start
        self.prefill_time += seconds
        for spec in specs:
            self.proposer.add_row(spec.row_id, list(spec.prompt_ids))
        if self.observer is not None:
            width = attention_mask.shape[1]
            for i, (spec, token) in enumerate(zip(specs, first.tolist())):
                features = None if pending is None else pending[i, width - len(spec.prompt_ids) :]
                self.observer.on_prefill(spec.row_id, spec.prompt_ids, features, last_logits[i], token)
        updates = self._emit([s.row_id for s in specs], [[t] for t in first.tolist()], ["prefill"] * len(specs))
        self._drop_finished(updates)
        return updates

    def _prefill(self, prompts: list[list[int]]):
        """One target forward over new prompts -> (cache, mask, position ids, last logits (b, V), features or None).

        The cache, the 0/1 mask, the positions and the drafter's context features (b, W, n*H) come laid out
        left-padded (each prompt right-aligned in W slots). Prompts of different lengths run ragged where the
        target allows it (:func:`ragged_forward`): packed into one row, so the linear layers see only real
        tokens instead of a burst of joiners padded to the longest; the cache is then right-aligned.
        """
        lengths = torch.tensor([len(p) for p in prompts], device=self.device)
        width = int(lengths.max())
        columns = torch.arange(width, device=self.device)
        offsets = width - lengths  # (b,) left padding of each row
        mask = (columns[None] >= offsets[:, None]).long()  # (b, W) left-padded
        positions = (mask.cumsum(-1) - 1).clamp_min(0)
        ragged = self.ragged and len(prompts) > 1 and int(lengths.sum()) < len(prompts) * width
        cache = RaggedCache()
        if not ragged:
            input_ids = torch.zeros(len(prompts), width, dtype=torch.long, device=self.device)
            for i, prompt in enumerate(prompts):
                input_ids[i, width - len(prompt) :] = torch.as_tensor(prompt, dtype=torch.long)
            with sdpa_gqa(self.device, width):
                out = self.target(
                    input_ids=input_ids,
                    attention_mask=mask,
                    position_ids=positions,
                    output_hidden_states=self.hidden_request,
                    logits_to_keep=1,
                    use_cache=True,
                    **{CACHE_KWARG: cache},
                )
            features = self.drafter_proposer.features(out.hidden_states) if self.use_drafter else None
            return cache, mask, positions, out.logits[:, -1], features
        layout = RaggedLayout.from_lengths(lengths, width)  # right-padded: row i's tokens in columns [0, len_i)
        # (1, T), row-major
        tokens = torch.cat([torch.as_tensor(p, dtype=torch.long, device=self.device) for p in prompts])[None]
        # padded keys come after every real query
        causal = torch.ones(width, width, dtype=torch.bool, device=self.device).tril()
        bias = torch.zeros(width, width, dtype=self.target.dtype, device=self.device).masked_fill(
            ~causal, torch.finfo(self.target.dtype).min
        )
        with sdpa_gqa(self.device, width), ragged_forward(layout):
            out = self.target(
                input_ids=tokens,
                position_ids=layout.pack(columns[None].expand(len(prompts), -1)),
                attention_mask=bias[None, None].expand(len(prompts), 1, -1, -1),
                output_hidden_states=self.hidden_request,
                logits_to_keep=lengths.cumsum(0) - 1,
                use_cache=True,
                **{CACHE_KWARG: cache},
            )
        # (b, W): left-padded slot j holds right-padded slot j - offset
        right_aligned = columns[None] - offsets[:, None]
        relayout_cache(cache, right_aligned.masked_fill(right_aligned < 0, -1))
        features = None
        if self.use_drafter:
            packed = self.drafter_proposer.features(out.hidden_states)  # (1, T, n*H)
            features = take_slots(layout.unpack(packed), right_aligned)
        return cache, mask, positions, out.logits[0], features

    def _merge(self, specs, cache, mask, next_pos, last_token, pending, pending_pos) -> None:
        for spec in specs:
            self.specs[spec.row_id] = spec
            self.num_new[spec.row_id] = 0
        row_ids = [s.row_id for s in specs]
        if not self.ids:
            self.ids = row_ids
            self.target_cache = cache
            self.slot_mask, self.next_pos, self.last_token = mask.long(), next_pos, last_token
            if self.drafter_proposer is not None:
                self.drafter_proposer.join(row_ids, pending, pending_pos, mask)
            return
        self._compact(force=False)
        b_old, b_new, length = len(self.ids), len(specs), mask.shape[1]
        # target: old rows [holes | slots], new rows [holes | prompt], right-aligned to the wider side
        total = max(self.num_slots, length)
        old_index = shifted_index(b_old, self.num_slots, total - self.num_slots, self.device)
        new_index = shifted_index(b_new, length, total - length, self.device)
        if total != self.num_slots:
            relayout_cache(self.target_cache, old_index)  # skipped when the old rows keep their layout (a full copy)
        relayout_cache(cache, new_index)
        for mine, theirs in zip(self.target_cache.layers, cache.layers):
            mine.keys = torch.cat([mine.keys, theirs.keys], dim=0)
            mine.values = torch.cat([mine.values, theirs.values], dim=0)
        self.slot_mask = torch.cat([take_slots(self.slot_mask, old_index), take_slots(mask.long(), new_index)], dim=0)
        if self.drafter_proposer is not None:  # new rows are all holes in the drafter's cache; their prompt is unread
            self.drafter_proposer.join(row_ids, pending, pending_pos, mask)
        self.next_pos = torch.cat([self.next_pos, next_pos])
        self.last_token = torch.cat([self.last_token, last_token])
        self.ids = self.ids + row_ids

    @torch.inference_mode()
    def drop_rows(self, row_ids: Sequence[Hashable]) -> None:
        """Remove rows (finished or cancelled) from the batch and both caches; unknown ids are ignored."""
        gone = set(row_ids) & set(self.ids)
        if not gone:
            return
        for row in gone:
            if self.observer is not None:
                self.observer.on_finish(row)
            self.specs.pop(row)
            self.num_new.pop(row)
            self.proposer.finish_row(row)
        size = len(self.ids) - len(gone)
        if size == 0:
            self._empty()
            return
        # Swap-remove: the surviving rows past the new batch size move into the freed places, so the caches
        # copy only the moved rows (an index_select would copy every layer's whole cache at each departure).
        holes = [i for i in range(size) if self.ids[i] in gone]
        movers = [i for i in range(size, len(self.ids)) if self.ids[i] not in gone]
        order = list(range(size))
        for hole, mover in zip(holes, movers):
            order[hole] = mover
        index = torch.tensor(order, dtype=torch.long, device=self.device)
        self.ids = [self.ids[i] for i in order]
        self.slot_mask, self.next_pos, self.last_token = (
            t.index_select(0, index) for t in (self.slot_mask, self.next_pos, self.last_token)
        )
        move_rows(self.target_cache, holes, movers, size)
        if self.drafter_proposer is not None:
            self.drafter_proposer.drop(gone, index, holes, movers, size)

    def _compact(self, force: bool = True) -> None:
        """Squeeze holes out of both caches, each on its own (:func:`~.kv_cache.pack_cache`)."""
        self.slot_mask = pack_cache(
            self.target_cache, self.slot_mask, force, self.compact_min_slots, self.compact_fraction
        )
        if self.drafter_proposer is not None:
            self.drafter_proposer.compact(force, self.compact_min_slots, self.compact_fraction)
