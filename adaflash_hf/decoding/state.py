"""The decoding state of a batch whose rows join and leave between rounds: prefill, step, add, drop.

:class:`SpeculativeBatch` is the engine's reusable core. ``generate`` adds every prompt once and
steps until the batch is empty; the serving scheduler adds requests as they arrive, steps, and drops
rows that finish or are cancelled. Every row has its own sampling parameters, stop ids and budget.

Cache layout. The target's cache is rectangular (b, slots); ``slot_mask`` (b, slots) marks the
slots that hold accepted tokens. Position ids are tracked per row, so a row's masked "holes" (left
padding, drafts it rejected while another row accepted more, slots added when rows joined) change
nothing in exact arithmetic. The drafter keeps its own layout: its cache (b, draft slots) with
``draft_mask``, and the target features it has not read yet in :class:`PendingContext`, which it
reads the next time it runs. The two sides are laid out, joined and compacted independently, so
rounds that skip the drafter cost what a plain batched step costs: the target's cache stays as
tight as it would be without a drafter, and the unread features are only collected.

Joining rows are prefilled on their own and merged right-aligned (holes on the left). Holes are
squeezed out ("compaction") when they make up a large share of a cache, with one gather per layer.

Round: propose (drafter block, suffix matches; a draft tree per row) -> choose verify lengths -> verify
(a tree with its ancestor mask) -> accept (walk the tree) -> crop -> update policy, acceptance estimates
and statistics. A tree's accepted path keeps its slots where they are and the other nodes become holes,
so trees need no cache copies.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from .._compat import (
    CACHE_KWARG,
    RaggedCache,
    RaggedLayout,
    engine_attention,
    ragged_forward,
    sdpa_gqa,
    supports_ragged,
)
from .cost import timer
from .outputs import RoundStats
from .policy import GoodputVerifyLength, VerifyLengthPolicy, report_round, verify_limit, wants_drafts
from .proposers import (
    NONE,
    DraftHead,
    DraftingConfig,
    DraftingState,
    HybridProposer,
    default_drafting_state,
    top_probs_and_tokens,
)
from .recording import RoundObserver
from .sampling import SamplingParams, greedy_accept, logits_to_probs, rejection_accept, sample
from .tree import checked_along_paths, is_chain, tree_accept, tree_attention_mask

GREEDY = SamplingParams()


@dataclass
class RowSpec:
    """One sequence to decode: its id (any hashable, unique in the batch), prompt and stopping rules."""

    row_id: Hashable
    prompt_ids: Sequence[int]
    max_new_tokens: int
    params: SamplingParams = GREEDY
    stop_ids: frozenset[int] = frozenset()


@dataclass
class RowUpdate:
    """Tokens a row gained in one call of :meth:`SpeculativeBatch.add_rows` or :meth:`~SpeculativeBatch.step`.

    finish_reason: None while the row runs, "stop" after a stop id (included in ``tokens``), "length"
    at its token budget. source: where this round's accepted drafts came from ("prefill" for the
    first token).
    """

    row_id: Hashable
    tokens: list[int]
    finish_reason: str | None
    source: str


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
    block_ids = torch.full((anchors.shape[0], block_size), drafter.config.mask_token_id, dtype=torch.long, device=anchors.device)
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


def path_sources(proposal, paths: list[list[int]], num_drafts: list[int]) -> list[str]:
    """Where each row's accepted drafts came from: the source of its deepest accepted node (of its
    best node when it accepted none); "none" for a row that verified no drafts."""
    if proposal.node_sources is None:
        return [s if n else NONE for s, n in zip(proposal.sources, num_drafts)]
    deepest = [path[-1] if path else 1 for path in paths]  # slot of the deepest accepted node, else of the best node
    return [nodes[slot - 1] if n else NONE for nodes, slot, n in zip(proposal.node_sources, deepest, num_drafts)]


def relayout_cache(cache: DynamicCache, index: torch.Tensor) -> None:
    """Rebuild every layer as ``new[i, :, j] = old[i, :, index[i, j]]``; index -1 makes a zero (masked) slot."""
    holes = index < 0
    gather = index.clamp_min(0)
    for layer in cache.layers:
        for name in ("keys", "values"):
            old = getattr(layer, name)
            b, h, _, d = old.shape
            new = old.gather(2, gather[:, None, :, None].expand(b, h, gather.shape[1], d))
            setattr(layer, name, new.masked_fill(holes[:, None, :, None], 0))


def packed_index(mask: torch.Tensor) -> torch.Tensor:
    """(b, S) 0/1 mask -> (b, S') indices of each row's valid slots, right-aligned, -1 padding on the left."""
    counts = mask.sum(-1)
    width = int(counts.max()) if mask.numel() else 0
    index = torch.full((mask.shape[0], width), -1, dtype=torch.long, device=mask.device)
    for i in range(mask.shape[0]):
        valid = mask[i].nonzero().flatten()
        if len(valid):
            index[i, width - len(valid):] = valid
    return index


def shifted_index(batch: int, length: int, offset: int, device) -> torch.Tensor:
    """(batch, offset + length) indices: ``offset`` holes, then slots 0..length-1."""
    index = torch.arange(-offset, length, device=device).expand(batch, -1).clone()
    index[:, :offset] = -1
    return index


class PendingContext:
    """Target features the drafter has not read yet, per row: chunks of (n, n*H) features and (n,) positions.

    Only accepted slots are kept (no holes), and each row's chunks live apart from the others', so rows
    join and leave without touching anyone else's context, and rounds that skip the drafter only
    append a view per row. :meth:`take` lays them out for the drafter when it runs. Past
    ``max_width`` tokens a row keeps its newest (the drafter then misses that far context; outputs are
    unchanged).
    """

    def __init__(self, max_width: int = 1024):
        self.rows: dict[Hashable, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.widths: dict[Hashable, int] = {}  # unread tokens per row
        self.max_width = max_width

    def add(self, row: Hashable, hidden: torch.Tensor, pos: torch.Tensor) -> None:
        """Append (n, n*H) features at positions (n,) to ``row``'s unread context."""
        self.rows.setdefault(row, []).append((hidden, pos))
        self.widths[row] = self.widths.get(row, 0) + len(pos)
        if self.widths[row] > self.max_width:
            hidden, pos = (torch.cat(parts)[-self.max_width:] for parts in zip(*self.rows[row]))
            self.rows[row], self.widths[row] = [(hidden, pos)], self.max_width

    def drop(self, row: Hashable) -> None:
        self.rows.pop(row, None)
        self.widths.pop(row, None)

    def take(self, rows: Sequence[Hashable], size: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The unread context of ``rows``, left-padded: (b, s, size) features, (b, s) positions, (b, s) 0/1
        mask; it is then read (emptied). ``like`` gives the features' dtype and device."""
        joined = [tuple(torch.cat(parts) for parts in zip(*self.rows[row])) if self.rows.get(row) else None for row in rows]
        width = max((self.widths.get(row, 0) for row in rows), default=0)
        hidden = like.new_zeros((len(rows), width, size))
        pos = torch.zeros((len(rows), width), dtype=torch.long, device=like.device)
        mask = torch.zeros_like(pos)
        for i, j in enumerate(joined):
            if j is not None and len(j[1]):
                n = len(j[1])
                hidden[i, width - n:], pos[i, width - n:], mask[i, width - n:] = j[0], j[1], 1
        self.rows, self.widths = {row: [] for row in rows}, {row: 0 for row in rows}
        return hidden, pos, mask


class SpeculativeBatch:
    """Rows decoding together with lossless speculative decoding; rows can join and leave between rounds.

    Args:
        target: the causal LM whose output distribution is reproduced exactly.
        drafter: an AdaFlash drafter for ``target``, or None to draft from suffix matches only.
        drafting: which draft sources rows may use (default: the drafting state's).
        drafting_state: acceptance statistics, the global suffix index and the measured verify cost,
            shared across batches (default: one per target model).
        verify_policy: chooses verify lengths per round (default: the state's goodput policy).
        draft_sampling: for sampled rows, sample the drafter's drafts from its distribution (exact
            with min(1, p/q)); otherwise drafts are deterministic (also exact).
        generator: torch RNG for sampling.
        on_round: called with each round's :class:`RoundStats` (and once per join with the prefill time).
        compact_min_slots: squeeze holes out of the caches once they exceed half of at least this many slots.
        observer: a :class:`~.recording.RoundObserver` (trajectory recording, adapter swaps between
            rounds); None costs nothing.
    """

    def __init__(
        self,
        target: PreTrainedModel,
        drafter=None,
        *,
        drafting: DraftingConfig | None = None,
        drafting_state: DraftingState | None = None,
        verify_policy: VerifyLengthPolicy | None = None,
        draft_sampling: bool = False,
        generator: torch.Generator | None = None,
        on_round: Callable[[RoundStats], None] | None = None,
        compact_min_slots: int = 256,
        observer: RoundObserver | None = None,
    ):
        self.target, self.drafter = target, drafter
        self.state = drafting_state or default_drafting_state(target)
        self.drafting = drafting or self.state.config
        self.use_drafter = drafter is not None and self.drafting.drafter
        self.policy = verify_policy or self.state.policy
        self.ragged = supports_ragged(target)  # rows of different verify lengths packed into one forward
        if isinstance(self.policy, GoodputVerifyLength):
            if self.policy.cost_model is None:
                self.policy.cost_model = self.state.cost_model
            self.policy.ragged = self.ragged
        self.draft_sampling, self.generator, self.on_round = draft_sampling, generator, on_round
        self.compact_min_slots = compact_min_slots
        self.observer = observer
        self.layer_ids = drafter.config.target_layer_ids if self.use_drafter else []
        self.feature_size = len(self.layer_ids) * target.get_input_embeddings().weight.shape[1]  # n*H
        self.hidden_request = [i + 1 for i in self.layer_ids] if self.use_drafter else None
        self.embed = target.get_input_embeddings()
        self.head = DraftHead(target.get_output_embeddings(), drafter.draft_vocab) if self.use_drafter else None
        self.vocab_size = target.get_output_embeddings().weight.shape[0]
        block_size = drafter.config.block_size if self.use_drafter else None
        self.proposer = HybridProposer(self.state, self.drafting, block_size, getattr(drafter, "adaflash_datastore", None))
        self.state.seed_acceptance(getattr(drafter, "adaflash_acceptance_prior", None))
        self.device = next(target.parameters()).device
        self.prefill_time = 0.0
        self._empty()

    def _empty(self) -> None:
        self.ids: list[Hashable] = []
        self.specs: dict[Hashable, RowSpec] = {}
        self.num_new: dict[Hashable, int] = {}
        self.target_cache, self.draft_cache = RaggedCache(), RaggedCache()
        self.slot_mask = torch.zeros(0, 0, dtype=torch.long, device=self.device)  # (b, S) 1 where a slot holds a token
        self.next_pos = torch.zeros(0, dtype=torch.long, device=self.device)  # (b,) position of last_token
        self.last_token = torch.zeros(0, dtype=torch.long, device=self.device)  # (b,) newest token, not yet seen by the target
        self.draft_mask = torch.zeros(0, 0, dtype=torch.long, device=self.device)  # (b, draft slots) 1 where the drafter cache holds context
        self.pending: PendingContext | None = None  # target features the drafter has not read yet
        self.fresh_context = 0  # context tokens the last round left unread: what a drafter that runs every round reads

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def num_slots(self) -> int:
        return self.slot_mask.shape[1]

    # ----------------------------------------------------------------------------------------------
    # add / drop
    @torch.inference_mode()
    def add_rows(self, specs: Sequence[RowSpec]) -> list[RowUpdate]:
        """Prefill new rows (one batched target forward) and merge them into the batch.

        Returns each new row's first token. Rows that finish on it (a stop id, or a budget of one
        token) are not kept.
        """
        if not specs:
            return []
        clash = [s.row_id for s in specs if s.row_id in self.specs] + [
            s.row_id for i, s in enumerate(specs) if s.row_id in {t.row_id for t in specs[:i]}]
        if clash:
            raise ValueError(f"row ids {clash} are already in the batch; give each row a unique id.")
        for spec in specs:
            if spec.max_new_tokens < 1 or not len(spec.prompt_ids):
                raise ValueError(f"row {spec.row_id!r}: needs a non-empty prompt and max_new_tokens >= 1.")
        start = timer(self.device)
        cache, attention_mask, position_ids, last_logits, pending = self._prefill([list(s.prompt_ids) for s in specs])
        first = self._choose(last_logits, [s.params for s in specs])
        self._merge(specs, cache, attention_mask, position_ids[:, -1] + 1, first, pending, position_ids)
        seconds = timer(self.device) - start
        self.prefill_time += seconds
        for spec in specs:
            self.proposer.add_row(spec.row_id, list(spec.prompt_ids))
        if self.observer is not None:
            width = attention_mask.shape[1]
            for i, (spec, token) in enumerate(zip(specs, first.tolist())):
                features = None if pending is None else pending[i, width - len(spec.prompt_ids):]
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
                input_ids[i, width - len(prompt):] = torch.as_tensor(prompt, dtype=torch.long)
            with sdpa_gqa(self.device, width):
                out = self.target(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                                  output_hidden_states=self.hidden_request, logits_to_keep=1, use_cache=True,
                                  **{CACHE_KWARG: cache})
            features = context_features(out.hidden_states, self.layer_ids) if self.use_drafter else None
            return cache, mask, positions, out.logits[:, -1], features
        layout = RaggedLayout.from_lengths(lengths, width)  # right-padded: row i's tokens in columns [0, len_i)
        tokens = torch.cat([torch.as_tensor(p, dtype=torch.long, device=self.device) for p in prompts])[None]  # (1, T), row-major
        causal = torch.ones(width, width, dtype=torch.bool, device=self.device).tril()  # padded keys come after every real query
        bias = torch.zeros(width, width, dtype=self.target.dtype, device=self.device).masked_fill(~causal, torch.finfo(self.target.dtype).min)
        with sdpa_gqa(self.device, width), ragged_forward(layout):
            out = self.target(input_ids=tokens, position_ids=layout.pack(columns[None].expand(len(prompts), -1)),
                              attention_mask=bias[None, None].expand(len(prompts), 1, -1, -1),
                              output_hidden_states=self.hidden_request, logits_to_keep=lengths.cumsum(0) - 1,
                              use_cache=True, **{CACHE_KWARG: cache})
        right_aligned = columns[None] - offsets[:, None]  # (b, W): left-padded slot j holds right-padded slot j - offset
        relayout_cache(cache, right_aligned.masked_fill(right_aligned < 0, -1))
        features = None
        if self.use_drafter:
            packed = context_features(out.hidden_states, self.layer_ids)  # (1, T, n*H)
            features = _take(layout.unpack(packed), right_aligned)
        return cache, mask, positions, out.logits[0], features

    def _merge(self, specs, cache, mask, next_pos, last_token, pending, pending_pos) -> None:
        for spec in specs:
            self.specs[spec.row_id] = spec
            self.num_new[spec.row_id] = 0
        if not self.ids:
            self.ids = [s.row_id for s in specs]
            self.target_cache, self.draft_cache = cache, RaggedCache()
            self.slot_mask, self.next_pos, self.last_token = mask.long(), next_pos, last_token
            self.draft_mask = self.slot_mask.new_zeros(len(specs), 0)
            self.pending = PendingContext() if self.use_drafter else None
            self._add_pending(specs, pending, pending_pos, mask)
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
        self.slot_mask = torch.cat([_take(self.slot_mask, old_index), _take(mask.long(), new_index)], dim=0)
        if self.use_drafter:  # drafter: new rows are all holes in its cache; their prompt features are unread
            if _initialized(self.draft_cache):
                _append_rows(self.draft_cache, b_new)
            self.draft_mask = torch.cat([self.draft_mask, self.draft_mask.new_zeros(b_new, self.draft_mask.shape[1])])
            self._add_pending(specs, pending, pending_pos, mask)
        self.next_pos = torch.cat([self.next_pos, next_pos])
        self.last_token = torch.cat([self.last_token, last_token])
        self.ids = self.ids + [s.row_id for s in specs]

    def _add_pending(self, specs, features, positions, mask) -> None:
        """Each new row's prompt features (its valid slots of the left-padded prefill) become unread context."""
        if not self.use_drafter:
            return
        for i, spec in enumerate(specs):
            n = int(mask[i].sum())
            self.pending.add(spec.row_id, features[i, -n:], positions[i, -n:])

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
        self.slot_mask, self.next_pos, self.last_token = (t.index_select(0, index) for t in (self.slot_mask, self.next_pos, self.last_token))
        if self.use_drafter:
            self.draft_mask = self.draft_mask.index_select(0, index)
            for row in gone:
                self.pending.drop(row)
        _move_rows(self.target_cache, holes, movers, size)
        _move_rows(self.draft_cache, holes, movers, size)

    def _compact(self, force: bool = True) -> None:
        """Squeeze holes out of the target's cache and the drafter's, each on its own.

        Rows keep different numbers of tokens, so packing can only free the columns that every row
        has a hole in after right-alignment; without ``force`` a cache is packed once it has at least
        ``compact_min_slots`` slots and those columns are a quarter of them.
        """
        self.slot_mask = self._pack(self.target_cache, self.slot_mask, force)
        if self.use_drafter and _initialized(self.draft_cache):
            self.draft_mask = self._pack(self.draft_cache, self.draft_mask, force)

    def _pack(self, cache: DynamicCache, mask: torch.Tensor, force: bool) -> torch.Tensor:
        """Right-align every row's valid slots of ``cache``; returns the new mask."""
        slots = mask.shape[1]
        removable = slots - int(mask.sum(-1).max()) if slots else 0  # slot columns that packing would free
        if removable == 0 or (not force and (slots < self.compact_min_slots or removable * 4 < slots)):
            return mask
        index = packed_index(mask)
        relayout_cache(cache, index)
        return _take(mask, index)

    # ----------------------------------------------------------------------------------------------
    # one round
    @torch.inference_mode()
    def step(self) -> list[RowUpdate]:
        """One draft -> verify round for every row; returns what each row gained."""
        if self.observer is not None:
            self.observer.before_round()
        if not self.ids:
            return []
        self._compact(force=False)
        device = self.device
        round_start = start = timer(device)
        drafted: dict[str, torch.Tensor | float] = {}

        def run_drafter() -> tuple[torch.Tensor, torch.Tensor, Callable]:
            tick = timer(device)
            context, context_pos, context_mask = self.pending.take(self.ids, self.feature_size, self.embed.weight)
            key_mask = torch.cat([self.draft_mask, context_mask], dim=1)
            drafted["hidden"] = draft_block(self.drafter, self.embed, self.last_token, context, context_pos,
                                            self.next_pos, key_mask, self.draft_cache)
            self.draft_mask = key_mask  # the drafter read the unread context into its cache
            positions = drafted["hidden"].shape[1] if limit is None else max(limit, 2)  # the anchor and the drafts a row can verify
            tokens, top_probs, drafted["logits"] = top_probs_and_tokens(self.head, drafted["hidden"][:, 1:positions])
            drafted["seconds"] = timer(device) - tick
            drafted["catch_up"] = catch_up_seconds(drafted["seconds"], int(context_mask.sum()), self.fresh_context,
                                                   drafted["hidden"].shape[0] * drafted["hidden"].shape[1])
            return tokens, top_probs, self.head.scorer(drafted["logits"])

        params = [self.specs[r].params for r in self.ids]
        sampled = [i for i, p in enumerate(params) if p.do_sample]
        budget = torch.tensor([self.specs[r].max_new_tokens - self.num_new[r] for r in self.ids])
        # Trees need one-hot drafts; a sampled drafter block (q known) is verified as a chain with min(1, p/q).
        tree = self.proposer.trees and not (sampled and self.draft_sampling)
        proposing = wants_drafts(self.policy, len(self.ids))
        limit = verify_limit(self.policy) if proposing else None
        if proposing:
            depths = budget - 1 if limit is None else (budget - 1).clamp_max(limit - 1)
            proposal = self.proposer.propose(self.ids, run_drafter if self.use_drafter else None, tree=tree,
                                             max_depths=depths.tolist(), max_len=None if limit is None else limit - 1)
        else:  # the policy holds plain steps for this batch size: no look-ups, no drafter
            proposal = self.proposer.no_proposal(self.ids)
        draft_hidden, draft_logits = drafted.get("hidden"), drafted.get("logits")
        verify_lens = self.policy.verify_lens(proposal.rates, draft_hidden, proposal.sources).cpu().clamp(1, proposal.tokens.shape[1] + 1)
        # A chain verifies at most the row's remaining budget; a tree's depth is capped by it already.
        longest = proposal.lengths if proposal.parents is not None else torch.minimum(proposal.lengths, budget - 1)
        num_drafts = torch.minimum(verify_lens - 1, longest).clamp_min(0)
        g = int(num_drafts.max())
        draft_tokens = proposal.tokens[:, :g].to(device)
        parents = None if proposal.parents is None or is_chain(proposal.parents[:, :g], num_drafts) else proposal.parents[:, :g].to(device)
        draft_probs = None
        if sampled and self.draft_sampling and g:
            draft_tokens, draft_probs = self._sample_drafter_rows(proposal.sources, draft_tokens, draft_logits, params)
        num_drafts = num_drafts.to(device)
        draft_time = timer(device) - start

        # Verify: one target pass over [anchor, drafts] for every row; a tree's nodes see only their ancestors.
        # Rows of different lengths are packed into one row (ragged) where that saves tokens, so the linear
        # layers see only real ones; attention still runs per row over the padded layout.
        start = timer(device)
        verify_ids = torch.cat([self.last_token[:, None], draft_tokens], dim=1)  # (b, g + 1)
        verify_lengths = num_drafts + 1  # (b,)
        num_verified = int(verify_lengths.sum())
        ragged = self.ragged and len(self.ids) > 1 and num_verified < verify_ids.numel()
        if parents is None:
            verify_pos = self.next_pos[:, None] + torch.arange(g + 1, device=device)
            if ragged:  # a chain is a tree whose node j's parent is slot j
                chain = torch.arange(g, device=device)[None].expand(len(self.ids), -1)
                attention_mask = tree_attention_mask(self.slot_mask, chain, self.target.dtype)
            else:
                attention_mask = torch.cat([self.slot_mask, torch.ones_like(verify_ids)], dim=1)  # (b, S + g + 1)
        else:
            depths = proposal.depths[:, :g].to(device)  # (b, g), 1 for a child of the anchor
            verify_pos = self.next_pos[:, None] + torch.cat([torch.zeros_like(depths[:, :1]), depths], dim=1)
            attention_mask = tree_attention_mask(self.slot_mask, parents, self.target.dtype)  # (b, 1, g + 1, S + g + 1)
        layout = RaggedLayout.from_lengths(verify_lengths, g + 1) if ragged else None
        inputs, positions = (verify_ids, verify_pos) if layout is None else (layout.pack(verify_ids), layout.pack(verify_pos))
        with engine_attention(device, g + 1), (nullcontext() if layout is None else ragged_forward(layout)):
            out = self.target(
                input_ids=inputs, position_ids=positions, attention_mask=attention_mask,
                output_hidden_states=self.hidden_request, use_cache=True, **{CACHE_KWARG: self.target_cache},
            )  # ragged: (1, T, ...) outputs, unpacked to (b, g + 1, ...) below
        features = context_features(out.hidden_states, self.layer_ids) if self.use_drafter else None
        target_logits = out.logits
        if layout is not None:
            target_logits = layout.unpack(target_logits)
            features = None if features is None else layout.unpack(features)
        if parents is None:
            accept_lengths, next_tokens = self._accept(draft_tokens, target_logits, num_drafts, draft_probs, params, sampled)
            paths = [list(range(1, n + 1)) for n in accept_lengths.tolist()]
        else:
            paths, next_tokens = tree_accept(draft_tokens, parents, target_logits, num_drafts, params, self.generator)
            accept_lengths = torch.tensor([len(p) for p in paths], device=device)
        verify_time = timer(device) - start

        # Crop: keep slots up to the furthest accepted one; the rest of each row becomes a hole.
        accepted_list = accept_lengths.tolist()
        slots = [[0, *path] for path in paths]  # per row, the verify slots that hold accepted tokens
        keep = max(max(row) for row in slots) + 1
        if keep < g + 1:
            self.target_cache.crop(keep - g - 1)
        if parents is None:
            kept = (torch.arange(keep, device=device)[None] <= accept_lengths[:, None]).long()  # (b, keep)
        else:
            kept = torch.zeros(len(slots), keep, dtype=torch.long, device=device)
            for i, row in enumerate(slots):
                kept[i, row] = 1
        self.slot_mask = torch.cat([self.slot_mask, kept], dim=1)
        if self.use_drafter:  # the drafter reads the new slots next time it runs (they wait while it is skipped)
            for i, (row, index) in enumerate(zip(self.ids, slots)):
                taken = slice(0, len(index)) if parents is None else index  # a chain's accepted slots are a prefix
                self.pending.add(row, features[i, taken], verify_pos[i, taken])
            self.fresh_context = sum(map(len, slots))
        self.next_pos = self.next_pos + accept_lengths + 1
        self.last_token = next_tokens

        # Learn from the round, then hand out the tokens.
        drafts_list = num_drafts.tolist()
        self.state.observe_round(num_verified if ragged else len(accepted_list) * (g + 1), verify_time, drafted.get("seconds"),
                                 rows=len(accepted_list), ragged=ragged)
        sources = path_sources(proposal, paths, drafts_list)
        checked = drafts_list if parents is None else checked_along_paths(parents, paths, drafts_list)
        if self.on_round is not None:
            self.on_round(RoundStats(list(self.ids), accepted_list, [n + 1 for n in drafts_list], draft_time, verify_time, sources,
                                    tree=parents is not None, checked=checked))
        tokens_list = draft_tokens.tolist()
        chunks = [[tokens_list[i][j - 1] for j in path] + [t] for i, (path, t) in enumerate(zip(paths, next_tokens.tolist()))]
        self.proposer.record(self.ids, chunks)
        updates = self._emit(list(self.ids), chunks, sources)
        if self.observer is not None:
            for i, (update, n) in enumerate(zip(updates, checked)):
                index = slots[i][: len(update.tokens)]
                self.observer.on_round(update.row_id, None if features is None else features[i, index], target_logits[i, index],
                                       update.tokens, n, update.source)
        report_round(self.policy, accept_lengths.cpu(), num_drafts.cpu() + 1,
                     timer(device) - round_start - drafted.get("catch_up", 0.0), proposing)  # the whole round, less catching up
        self._drop_finished(updates)
        return updates

    def _choose(self, logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
        """(b, V) logits -> (b,) next tokens, each row with its own sampling parameters."""
        tokens = logits.max(-1).indices
        for i, p in enumerate(params):
            if p.do_sample:
                tokens[i] = sample(logits_to_probs(logits[i], p), self.generator)
        return tokens

    def _accept(self, draft_tokens, logits, num_drafts, draft_probs, params, sampled):
        """Greedy acceptance for greedy rows, rejection sampling for sampled rows (each with its own params)."""
        if not sampled:
            return greedy_accept(draft_tokens, logits, num_drafts)
        accept_lengths, next_tokens = greedy_accept(draft_tokens, logits, num_drafts)
        index = torch.tensor(sampled, device=logits.device)
        probs = torch.stack([logits_to_probs(logits[i], params[i]) for i in sampled])
        lengths, tokens = rejection_accept(draft_tokens[index], probs, num_drafts[index],
                                           None if draft_probs is None else draft_probs[index], self.generator)
        accept_lengths[index], next_tokens[index] = lengths, tokens
        return accept_lengths, next_tokens

    def _sample_drafter_rows(self, sources, draft_tokens, draft_logits, params):
        """Sampled drafts for sampled rows that took the drafter's block; one-hot q elsewhere.

        Returns draft_tokens (b, g) and draft_probs (b, g, V) over the target vocabulary, so that
        rejection sampling with min(1, p/q) stays exact for every row.
        """
        g = draft_tokens.shape[1]
        draft_probs = torch.zeros(*draft_tokens.shape, self.vocab_size, device=draft_tokens.device)
        draft_probs.scatter_(-1, draft_tokens[..., None], 1.0)
        if draft_logits is None:
            return draft_tokens, draft_probs
        draft_tokens = draft_tokens.clone()
        for i, (source, p) in enumerate(zip(sources, params)):
            if source == "drafter" and p.do_sample:
                q = self.head.to_target_probs(logits_to_probs(draft_logits[i, :g], p), self.vocab_size)
                draft_tokens[i] = sample(q, self.generator)
                draft_probs[i] = q
        return draft_tokens, draft_probs

    def _emit(self, ids, chunks, sources) -> list[RowUpdate]:
        """Cut each row's chunk at its first stop id and at its budget; count the tokens."""
        updates = []
        for row, chunk, source in zip(ids, chunks, sources):
            spec = self.specs[row]
            chunk = chunk[: spec.max_new_tokens - self.num_new[row]]
            reason = None
            for j, token in enumerate(chunk):
                if token in spec.stop_ids:
                    chunk, reason = chunk[: j + 1], "stop"
                    break
            self.num_new[row] += len(chunk)
            if reason is None and self.num_new[row] >= spec.max_new_tokens:
                reason = "length"
            self.proposer.extend_row(row, chunk)
            updates.append(RowUpdate(row, chunk, reason, source))
        return updates

    def _drop_finished(self, updates: list[RowUpdate]) -> None:
        self.drop_rows([u.row_id for u in updates if u.finish_reason is not None])


def _take(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Re-lay a (b, S, ...) mask or feature tensor like :func:`relayout_cache`: ``new[i, j] = x[i, index[i, j]]``,
    index -1 gives zeros."""
    gathered = x[torch.arange(x.shape[0], device=x.device)[:, None], index.clamp_min(0)]
    return gathered.masked_fill((index < 0).view(*index.shape, *([1] * (x.dim() - 2))), 0)


def _initialized(cache: DynamicCache) -> bool:
    """Whether the cache holds per-row tensors (possibly of length 0 after compaction)."""
    return bool(cache.layers) and all(layer.is_initialized for layer in cache.layers)


def _move_rows(cache: DynamicCache, holes: list[int], movers: list[int], size: int) -> None:
    """Copy rows ``movers`` of every initialised layer into rows ``holes`` (in place), then keep the first ``size``."""
    for layer in cache.layers:
        if layer.is_initialized:
            for name in ("keys", "values"):
                tensor = getattr(layer, name)
                for hole, mover in zip(holes, movers):
                    tensor[hole].copy_(tensor[mover])
                setattr(layer, name, tensor[:size])


def _append_rows(cache: DynamicCache, count: int) -> None:
    """Add ``count`` all-hole rows (zeros) to every layer of ``cache``."""
    for layer in cache.layers:
        for name in ("keys", "values"):
            old = getattr(layer, name)
            setattr(layer, name, torch.cat([old, old.new_zeros((count, *old.shape[1:]))], dim=0))
