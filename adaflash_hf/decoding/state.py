"""The decoding state of a batch whose rows join and leave between rounds: prefill, step, add, drop.

:class:`SpeculativeBatch` is the engine's reusable core. ``generate`` adds every prompt once and
steps until the batch is empty; the serving scheduler adds requests as they arrive, steps, and drops
rows that finish or are cancelled. Every row has its own sampling parameters, stop ids and budget.

Cache layout. The target's cache is rectangular (b, slots); ``slot_mask`` (b, slots) marks the
slots that hold accepted tokens. Position ids are tracked per row, so a row's masked "holes" (left
padding, drafts it rejected while another row accepted more, slots added when rows joined) change
nothing in exact arithmetic. The drafter keeps its own layout (:class:`~.proposers.drafter.DrafterProposer`),
so the target's cache stays as tight as it would be without a drafter.

Joining rows are prefilled on their own and merged right-aligned (holes on the left; :mod:`.membership`). Holes
are squeezed out ("compaction") when they make up a large share of a cache, with one gather per layer
(:mod:`.kv_cache`).

A round (:meth:`SpeculativeBatch.step`): propose -> choose verify lengths -> verify (one forward) -> accept ->
commit the cache -> report to observers -> learn. A tree's accepted path keeps its slots where they are and the
other nodes become holes, so trees need no cache copies.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from .._compat import CACHE_KWARG, engine_attention, ragged_forward, supports_ragged
from . import verify
from .config import DraftingConfig
from .cost import timer
from .draft_tree import checked_along_paths, is_chain
from .drafting_state import DraftingState, default_drafting_state
from .kv_cache import COMPACT_FRACTION, RaggedCache
from .learning import VerifiedRound, learn_from_round
from .membership import BatchMembership
from .outputs import RoundStats
from .policy import (
    GoodputVerifyLength,
    VerifyLengthPolicy,
    choose_verify_lens,
    failed_rows,
    verify_limit,
    wants_drafts,
)
from .proposers.base import Proposal
from .proposers.drafter import DrafterProposer
from .proposers.hybrid import HybridProposer
from .recording import RoundObserver
from .sampling import SamplingParams
from .verify import Drafts, VerifyOutput, accept, path_sources, unpacked, verify_inputs

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


class SpeculativeBatch(BatchMembership):
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
        compact_min_slots: squeeze holes out of the caches only once they have at least this many slots...
        compact_fraction: ...and packing would free this fraction of them.
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
        compact_fraction: float = COMPACT_FRACTION,
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
            if self.policy.drafter_cost is None:
                self.policy.drafter_cost = self.state.drafter_cost
            if self.policy.proposal_overhead is None:
                self.policy.proposal_overhead = self.state.proposal_overhead
            self.policy.ragged = self.ragged
        self.draft_sampling, self.generator, self.on_round = draft_sampling, generator, on_round
        self.compact_min_slots, self.compact_fraction, self.observer = compact_min_slots, compact_fraction, observer
        self.drafter_proposer = DrafterProposer(drafter, target) if self.use_drafter else None
        self.hidden_request = None if self.drafter_proposer is None else self.drafter_proposer.hidden_request
        self.vocab_size = target.get_output_embeddings().weight.shape[0]
        self.proposer = HybridProposer(
            self.state, self.drafting, self.drafter_proposer, getattr(drafter, "adaflash_datastore", None)
        )
        self.state.seed_acceptance(getattr(drafter, "adaflash_acceptance_prior", None))
        self.device = next(target.parameters()).device
        self.prefill_time = 0.0
        self._empty()

    def _empty(self) -> None:
        self.ids: list[Hashable] = []
        self.specs: dict[Hashable, RowSpec] = {}
        self.num_new: dict[Hashable, int] = {}
        self.target_cache = RaggedCache()
        self.slot_mask = torch.zeros(0, 0, dtype=torch.long, device=self.device)  # (b, S) 1 where a slot holds a token
        self.next_pos = torch.zeros(0, dtype=torch.long, device=self.device)  # (b,) position of last_token
        # (b,) newest token, not yet seen by the target
        self.last_token = torch.zeros(0, dtype=torch.long, device=self.device)
        if self.drafter_proposer is not None:
            self.drafter_proposer.reset()

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def num_slots(self) -> int:
        return self.slot_mask.shape[1]

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
        round_start = timer(self.device)
        params = [self.specs[r].params for r in self.ids]
        sampled = [i for i, p in enumerate(params) if p.do_sample]
        budget = torch.tensor([self.specs[r].max_new_tokens - self.num_new[r] for r in self.ids])

        # 1. Propose: every row's candidates, merged into a draft tree (or its best chain), or nothing at all.
        proposing = wants_drafts(self.policy, len(self.ids))
        proposal = self._propose(proposing, budget, sampled)
        # 2. Choose verify lengths: the policy's choice, cut to what each row's proposal and budget hold.
        drafts = self._choose_drafts(proposal, budget, params, sampled)
        draft_time = timer(self.device) - round_start
        # 3. Verify: one target forward over [anchor, drafts] for every row.
        start = timer(self.device)
        verified = self._verify(drafts)
        # 4. Accept: per row, the longest accepted prefix (or tree path) and the target's next token.
        paths, accept_lengths, next_tokens = accept(drafts, verified.target_logits, params, sampled, self.generator)
        verify_time = timer(self.device) - start
        # 5. Commit the cache: accepted slots stay, the rest become holes; the drafter reads them later.
        slots = self._commit(drafts, verified, paths, accept_lengths, next_tokens)
        # 6. Report: hand out the tokens, tell the round's callback and the observer.
        drafts_list = drafts.num_drafts.tolist()
        sources = path_sources(proposal, paths, drafts_list)
        chunks, updates = self._report(
            drafts,
            verified,
            paths,
            slots,
            next_tokens,
            accept_lengths,
            sources,
            draft_time,
            verify_time,
            proposal.failed,
        )
        # 7. Learn: costs, acceptance estimates and the policy's feedback, timed over the whole round.
        learn_from_round(
            self.state,
            self.policy,
            proposal,
            VerifiedRound(accept_lengths, drafts.num_drafts, verified.num_tokens, verified.ragged, verify_time),
            chunks,
            proposing,
            round_start,
            self.device,
            list(self.ids),
        )
        self._drop_finished(updates)
        return updates

    def _propose(self, proposing: bool, budget: torch.Tensor, sampled: list[int]) -> Proposal:
        if not proposing:  # the policy holds plain steps for this batch size: no look-ups, no drafter
            return self.proposer.no_proposal(self.ids)
        limit = verify_limit(self.policy)
        depths = budget - 1 if limit is None else (budget - 1).clamp_max(limit - 1)
        # Trees need one-hot drafts; a sampled drafter block (q known) is verified as a chain with min(1, p/q).
        tree = self.proposer.trees and not (sampled and self.draft_sampling)
        return self.proposer.propose(
            self.ids,
            self.last_token,
            self.next_pos,
            tree=tree,
            max_depths=depths.tolist(),
            max_len=None if limit is None else limit - 1,
        )

    def _choose_drafts(
        self, proposal: Proposal, budget: torch.Tensor, params: list[SamplingParams], sampled: list[int]
    ) -> Drafts:
        block = proposal.block
        draft_hidden, draft_logits = (None, None) if block is None else (block.hidden, block.logits)
        verify_lens = (
            choose_verify_lens(self.policy, proposal.rates, draft_hidden, proposal.sources, self.ids)
            .cpu()
            .clamp(1, proposal.tokens.shape[1] + 1)
        )
        # A chain verifies at most the row's remaining budget; a tree's depth is capped by it already.
        longest = proposal.lengths if proposal.parents is not None else torch.minimum(proposal.lengths, budget - 1)
        num_drafts = torch.minimum(verify_lens - 1, longest).clamp_min(0)
        g = int(num_drafts.max())
        draft_tokens = proposal.tokens[:, :g].to(self.device)
        tree = proposal.parents is not None and not is_chain(proposal.parents[:, :g], num_drafts)
        parents = proposal.parents[:, :g].to(self.device) if tree else None
        draft_probs = None
        if sampled and self.draft_sampling and g:
            draft_tokens, draft_probs = verify.sample_drafter_rows(
                proposal.sources,
                draft_tokens,
                draft_logits,
                params,
                self.drafter_proposer.head if self.use_drafter else None,
                self.vocab_size,
                self.generator,
            )
        num_drafts = num_drafts.to(self.device)
        depths = proposal.depths[:, :g].to(self.device) if tree else None  # (b, g), 1 for a child of the anchor
        return Drafts(draft_tokens, num_drafts, parents, depths, draft_probs)

    def _verify(self, drafts: Drafts) -> VerifyOutput:
        """Rows of different lengths are packed into one row (ragged) where that saves tokens, so the linear
        layers see only real ones; attention still runs per row over the padded layout."""
        b, g = drafts.draft_tokens.shape
        num_verified = int((drafts.num_drafts + 1).sum())
        ragged = self.ragged and b > 1 and num_verified < b * (g + 1)
        inputs = verify_inputs(
            self.last_token,
            self.next_pos,
            self.slot_mask,
            drafts.draft_tokens,
            drafts.parents,
            drafts.depths,
            drafts.num_drafts,
            ragged,
            self.target.dtype,
        )
        layout = inputs.layout
        ids, positions = (
            (inputs.input_ids, inputs.position_ids)
            if layout is None
            else (layout.pack(inputs.input_ids), layout.pack(inputs.position_ids))
        )
        with engine_attention(self.device, g + 1), nullcontext() if layout is None else ragged_forward(layout):
            out = self.target(
                input_ids=ids,
                position_ids=positions,
                attention_mask=inputs.attention_mask,
                output_hidden_states=self.hidden_request,
                use_cache=True,
                **{CACHE_KWARG: self.target_cache},
            )  # ragged: (1, T, ...) outputs, unpacked to (b, g + 1, ...) below
        features = self.drafter_proposer.features(out.hidden_states) if self.use_drafter else None
        return VerifyOutput(
            *unpacked(layout, out.logits, features),
            inputs.position_ids,
            num_verified if ragged else b * (g + 1),
            ragged,
        )

    def _commit(
        self,
        drafts: Drafts,
        verified: VerifyOutput,
        paths: list[list[int]],
        accept_lengths: torch.Tensor,
        next_tokens: torch.Tensor,
    ) -> list[list[int]]:
        """Keep slots up to the furthest accepted one (the rest of each row becomes a hole); returns per row the
        verify slots that hold accepted tokens."""
        g = drafts.draft_tokens.shape[1]
        slots = [[0, *path] for path in paths]
        keep = max(max(row) for row in slots) + 1
        if keep < g + 1:
            self.target_cache.crop(keep - g - 1)
        if chain := drafts.parents is None:
            kept = (torch.arange(keep, device=self.device)[None] <= accept_lengths[:, None]).long()  # (b, keep)
        else:
            kept = torch.zeros(len(slots), keep, dtype=torch.long, device=self.device)
            for i, row in enumerate(slots):
                kept[i, row] = 1
        self.slot_mask = torch.cat([self.slot_mask, kept], dim=1)
        if self.drafter_proposer is not None:  # the drafter reads the new slots next time it runs
            self.drafter_proposer.commit(self.ids, verified.features, verified.position_ids, slots, chain)
        self.next_pos = self.next_pos + accept_lengths + 1
        self.last_token = next_tokens
        return slots

    def _report(
        self,
        drafts: Drafts,
        verified: VerifyOutput,
        paths: list[list[int]],
        slots: list[list[int]],
        next_tokens: torch.Tensor,
        accept_lengths: torch.Tensor,
        sources: list[str],
        draft_time: float,
        verify_time: float,
        failed: list[int],
    ) -> tuple[list[list[int]], list[RowUpdate]]:
        """Hand out the tokens, tell ``on_round`` (and failed drafts) and the observer -> (chunks, updates)."""
        drafts_list = drafts.num_drafts.tolist()
        checked = drafts_list if drafts.parents is None else checked_along_paths(drafts.parents, paths, drafts_list)
        if self.on_round is not None:
            self.on_round(
                RoundStats(
                    list(self.ids),
                    accept_lengths.tolist(),
                    [n + 1 for n in drafts_list],
                    draft_time,
                    verify_time,
                    sources,
                    tree=drafts.parents is not None,
                    checked=checked,
                    draft_failures=len(set(failed) | set(failed_rows(self.policy))),
                )
            )
        tokens_list = drafts.draft_tokens.tolist()
        chunks = [
            [tokens_list[i][j - 1] for j in path] + [t] for i, (path, t) in enumerate(zip(paths, next_tokens.tolist()))
        ]
        updates = self._emit(list(self.ids), chunks, sources)
        if self.observer is not None:
            features = verified.features
            for i, (update, n) in enumerate(zip(updates, checked)):
                index = slots[i][: len(update.tokens)]
                self.observer.on_round(
                    update.row_id,
                    None if features is None else features[i, index],
                    verified.target_logits[i, index],
                    update.tokens,
                    n,
                    update.source,
                )
        return chunks, updates

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
