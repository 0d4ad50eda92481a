"""Verify-length policies: how many tokens the target verifies per row in each round.

``verify_len`` counts the anchor (last accepted token) plus the drafts checked, so a policy returns
values in [1, m + 1] for a proposal of m drafts, and a row verifies ``verify_len - 1`` drafts (1 is a
plain decode step). The engine runs one target forward over every row's verify length: rows packed
into one ("ragged", so the linear layers see only the real tokens) where the target runs SDPA
attention, else padded to the longest row.

A policy sees the estimated acceptance of every draft, the drafter's hidden states (the length head reads them)
and where each row's drafts came from; it is told what each round cost and accepted, to adapt to machine and load.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

from .cap_bandit import CapBandit
from .cost import VerifyCostModel
from .goodput import goodput_verify_len, ragged_verify_lens, within_slowdown
from .row_trust import RowPace, RowTrust
from .throughput_guard import ThroughputGuard

if TYPE_CHECKING:
    from ..modeling_length_head import AdaFlashLengthHead

logger = logging.getLogger(__name__)


class VerifyLengthPolicy(Protocol):
    def verify_lens(
        self, rates: torch.Tensor, draft_hidden_states: torch.Tensor | None, sources: list[str] | None = None
    ) -> torch.Tensor:
        """rates (b, m) estimated P(accept draft k | drafts < k accepted), 0 past a row's proposal;
        draft_hidden_states (b, B, H) or None when no drafter ran; sources per row ("drafter", "suffix",
        "global", "datastore", "tree" for a draft tree of several sources, or "none"), None when unknown
        -> verify_len (b,) long in [1, m + 1]. A draft tree's rates are those of its nodes in order
        (:func:`~.draft_tree.chain_rates`), so a verify length keeps its likeliest nodes."""

    def update(
        self, accept_lengths: torch.Tensor, verify_lens: torch.Tensor, seconds: float, proposed: bool | None = None
    ) -> None:
        """Feedback after a round: accepted drafts (b,), verify lengths (b,), the seconds the whole
        round took (proposal, verification and bookkeeping), and whether it made proposals (the answer
        of :func:`wants_drafts`; None where unknown). The parameter is optional: the engine passes it
        only to policies whose ``update`` takes it (:func:`report_round`)."""


def wants_drafts(policy: VerifyLengthPolicy, rows: int) -> bool:
    """Whether a round of ``rows`` rows should propose drafts at all (asked before any proposal is made).

    A policy may answer False to make the round a plain step without paying for proposals or the
    drafter; a policy without a ``wants_drafts`` method always proposes.
    """
    ask = getattr(policy, "wants_drafts", None)
    return True if ask is None else bool(ask(rows))


def failed_rows(policy: VerifyLengthPolicy) -> list[int]:
    """Rows whose verify length the policy's own model failed to predict in its last :meth:`verify_lens` (a length
    head that raised or returned non-finite rates); they verified only their anchor. Empty for other policies."""
    return list(getattr(policy, "failed_rows", ()))


def verify_limit(policy: VerifyLengthPolicy) -> int | None:
    """The most tokens (anchor included) a row may verify in the round :func:`wants_drafts` just allowed, known before
    anything is proposed (a fixed length, or the arm it chose); None where it decides on seeing the proposal.
    Proposals are cut to it, so look-ups and the draft head do no work past what the round can verify."""
    ask = getattr(policy, "round_verify_limit", None)
    return None if ask is None else ask()


@functools.cache
def _parameters(method) -> frozenset[str]:
    return frozenset(inspect.signature(method).parameters)


def choose_verify_lens(
    policy: VerifyLengthPolicy,
    rates: torch.Tensor,
    draft_hidden_states: torch.Tensor | None,
    sources: list[str] | None,
    rows: Sequence[Hashable],
) -> torch.Tensor:
    """``policy.verify_lens``, with the row ids where it takes ``rows`` (three-argument policies keep working)."""
    if "rows" in _parameters(type(policy).verify_lens):
        return policy.verify_lens(rates, draft_hidden_states, sources, rows=rows)
    return policy.verify_lens(rates, draft_hidden_states, sources)


def report_round(
    policy: VerifyLengthPolicy,
    accept_lengths: torch.Tensor,
    verify_lens: torch.Tensor,
    seconds: float,
    proposed: bool,
    rows: Sequence[Hashable] | None = None,
) -> None:
    """``policy.update`` after a round, with ``proposed`` and the row ids where its ``update`` takes them."""
    takes = _parameters(type(policy).update)
    extra = {"proposed": proposed} if "proposed" in takes else {}
    if "rows" in takes and rows is not None:
        extra["rows"] = rows
    policy.update(accept_lengths, verify_lens, seconds, **extra)


@dataclass
class FixedVerifyLength:
    """Verify a fixed number of tokens per row (default: the whole proposal)."""

    verify_len: int | None = None

    def __post_init__(self):
        if self.verify_len is not None and self.verify_len < 1:
            raise ValueError(f"verify_len={self.verify_len}: must be >= 1 (the anchor plus any drafts).")

    def wants_drafts(self, rows: int) -> bool:
        return self.verify_len != 1  # verifying only the anchor: plain steps, so nothing to propose

    def round_verify_limit(self) -> int | None:
        return self.verify_len

    def verify_lens(
        self, rates: torch.Tensor, draft_hidden_states: torch.Tensor | None, sources: list[str] | None = None
    ) -> torch.Tensor:
        length = rates.shape[1] + 1 if self.verify_len is None else min(self.verify_len, rates.shape[1] + 1)
        return torch.full((rates.shape[0],), length, dtype=torch.long)

    def update(
        self, accept_lengths: torch.Tensor, verify_lens: torch.Tensor, seconds: float, proposed: bool | None = None
    ) -> None:
        pass


@dataclass
class GoodputVerifyLength:
    """Maximise expected tokens per second: sum over rows of (1 + E[accepted | g drafts]) / cost(b rows, g + 1).

    Four mechanisms, composed here (the last opt-in):

    - the goodput choice (:mod:`.goodput`): E comes from the proposal's estimated acceptance rates; cost from a
      :class:`VerifyCostModel`, measured on this machine as rounds run (the engine binds the drafting state's
      model when none is given). g = 0 (a plain step) wins when no draft is likely enough to pay for a longer
      forward. The forward is rectangular, so one g serves the whole batch; where the engine runs ragged
      forwards (``ragged``, set by the engine for SDPA targets) each row gets its own length
      (:func:`~.goodput.ragged_verify_lens`);
    - the throughput guard (:class:`~.throughput_guard.ThroughputGuard`, fields ``margin`` to ``min_rows``,
      ``resume_z`` to ``hold_z``): before anything is proposed (:meth:`wants_drafts`), plain steps while
      speculative rounds of this batch size realise less than plain steps do (with ``hold_z`` > 0, opt-in, by that
      many standard errors); a held batch size resumes only once its explored rounds beat plain steps by
      ``resume_z`` standard errors (the last ``resume_rounds`` of them, ``resume_min_rounds`` at least). The engine
      reports a round that resumes drafting without the drafter's catching up on the context held back meanwhile
      (:func:`~adaflash_hf.decoding.proposers.drafter.catch_up_seconds`);
    - the verify-length arms (:class:`~.cap_bandit.CapBandit`, fields ``caps`` to ``cap_prune_every`` and
      ``min_cap_steps``): each speculative round of ``min_rows`` rows or more verifies under the goodput choice or a
      fixed length, whichever has realised the most in its bucket; the guard compares plain steps with its rounds;
    - the row slowdown bound (opt-in, ``max_row_slowdown``, :func:`~.goodput.within_slowdown`): in a batch of
      ``slowdown_min_rows`` rows or more (``min_rows`` at least), drafts are dropped, least likely first, until the
      round's estimated cost (with the drafter's pass, ``drafter_cost``, and what proposing spends beyond a plain
      step on look-ups, the tree and bookkeeping, ``proposal_overhead``; both measured by the engine) over a plain
      step's is at most ``max_row_slowdown`` times the least-served row's expected tokens. Every row waits for the
      whole round, so this bounds how much slower than plain decoding any request runs: its tail latency under
      load. With ``row_slack`` a row may spend the tokens it is ahead of plain pace (:class:`~.row_trust.RowPace`),
      so only rows at plain pace set the bound. None (the default): no bound.

    Rows whose drafts are rarely accepted are rated by what they got (:class:`~.row_trust.RowTrust`), so their
    expected tokens, and with them the bound, follow the requests actually in the batch.
    """

    max_verify_len: int | None = None
    cost_model: VerifyCostModel | None = None
    margin: float = 1.02
    desync_per_row: float = 0.008
    explore_every: int = 16
    max_explore_every: int = 256
    explore_budget: float = 0.01
    burst_rounds: int = 3
    min_evidence: int = 8
    min_cap_steps: float = 4.0
    refresh_plain_every: int = 64
    decay: float = 0.9
    min_rows: int = 2
    caps: tuple[int, ...] = (4, 2)
    cap_explore_every: int = 8
    cap_prune: float = 0.85
    cap_prune_every: int = 4
    ragged: bool = False
    row_trust: bool = True
    row_min_rate: float = 0.1
    tail_quantile: float = 0.1
    tail_tolerance: float | None = None
    tail_min_rounds: int = 6
    tail_rows: int = 64
    resume_z: float = 1.0
    resume_rounds: int = 12
    resume_min_rounds: int = 1
    hold_z: float = 0.0
    max_row_slowdown: float | None = None
    row_slack: bool = True
    slowdown_min_rows: int = 12
    drafter_cost: Callable[[int], float | None] | None = field(default=None, repr=False)  # bound by the engine
    proposal_overhead: Callable[[int], float | None] | None = field(default=None, repr=False)  # bound by the engine
    round_log: Callable[[dict], None] | None = field(default=None, repr=False)  # sees every round update() files
    _round_cap: int | None = field(default=None, repr=False)  # the cap wants_drafts chose for the round it allowed
    _used_cap: tuple | None = field(default=None, repr=False)  # (rows, cap) verify_lens applied, for update to file
    _round_rates: tuple | None = field(default=None, repr=False)  # (row ids, rates before RowTrust) of the round

    def __post_init__(self):
        if self.burst_rounds < 1:
            raise ValueError(f"burst_rounds={self.burst_rounds}: must be >= 1.")
        if any(cap < 2 for cap in self.caps) or self.cap_explore_every < 2 or self.cap_prune_every < 1:
            raise ValueError(
                f"caps={self.caps}, cap_explore_every={self.cap_explore_every}, cap_prune_every="
                f"{self.cap_prune_every}: each cap must be >= 2 (the anchor and at least one draft), "
                "cap_explore_every >= 2 and cap_prune_every >= 1."
            )
        self.guard = ThroughputGuard(
            self.margin,
            self.desync_per_row,
            self.explore_every,
            self.max_explore_every,
            self.explore_budget,
            self.burst_rounds,
            self.min_evidence,
            self.refresh_plain_every,
            self.decay,
            self.min_rows,
            self.tail_quantile,
            self.tail_tolerance,
            self.tail_min_rounds,
            self.tail_rows,
            self.resume_z,
            self.resume_rounds,
            self.resume_min_rounds,
            self.hold_z,
        )
        self.trust, self.pace = RowTrust(), RowPace()
        self.bandit = CapBandit(
            self.caps, self.cap_explore_every, self.cap_prune, self.cap_prune_every, self.min_cap_steps, self.decay
        )

    @property
    def realised(self) -> dict:
        """(rows bucket, speculative?) -> [decayed tokens, decayed time] of whole rounds (the guard's evidence)."""
        return self.guard.realised

    def rate(self, bucket: int, speculative: bool) -> float | None:
        """:meth:`ThroughputGuard.rate`: realised tokens per row per plain step's time of one kind of round."""
        return self.guard.rate(bucket, speculative)

    def desync_cost(self, bucket: int) -> float:
        return self.guard.desync_cost(bucket)

    def losing(self, bucket: int) -> bool:
        """Whether speculative rounds of this bucket realise less than plain steps (see
        :meth:`ThroughputGuard.speculative_rate`)."""
        return self.guard.losing(bucket, self.bandit.best_rate(bucket))

    def cap_rate(self, bucket: int, cap: int | None) -> float | None:
        return self.bandit.cap_rate(bucket, cap)

    def wants_drafts(self, rows: int) -> bool:
        """Whether this round proposes (the guard's answer, :meth:`ThroughputGuard.allows`). A round it allows also
        gets its verify-length arm (:meth:`CapBandit.choose`); an explored round verifies up to a cap, whatever the
        cost model says."""
        proposing = self.guard.allows(rows, self.bandit.best_rate(rows.bit_length()))
        chooses = proposing and rows >= self.min_rows and self.caps
        self._round_cap = self.bandit.choose(rows.bit_length()) if chooses else None
        if self.guard.remeasuring and self._round_cap is None and self.caps:
            self._round_cap = max(self.caps)
        return proposing

    def round_verify_limit(self) -> int | None:
        """The round's arm (chosen by :meth:`wants_drafts`) or ``max_verify_len``, whichever is shorter."""
        return min((n for n in (self.max_verify_len, self._round_cap) if n is not None), default=None)

    def verify_lens(
        self,
        rates: torch.Tensor,
        draft_hidden_states: torch.Tensor | None,
        sources: list[str] | None = None,
        rows: Sequence[Hashable] | None = None,
    ) -> torch.Tensor:
        """``rows``: the batch's row ids (the engine passes them); with them, in a batch of ``min_rows`` rows or more,
        each row's estimates are scaled by how its drafts have fared (:class:`~.row_trust.RowTrust`), so rows whose
        drafts are rarely accepted fall back to plain steps first."""
        cost_model = self.cost_model or VerifyCostModel()
        num_rows, cap = rates.shape[0], self._round_cap
        self._round_cap = None
        if num_rows < self.min_rows:
            cap = None
        self._used_cap = (num_rows, cap)
        self._round_rates = None
        if rows is not None and self.row_trust and len(rows) == num_rows:
            self._round_rates = (list(rows), rates)
            if num_rows >= self.min_rows:  # alone, a row's drafts delay no one: its own goodput choice decides
                rates = self.trust.scale(rows, rates)
        limit = min((n for n in (self.max_verify_len, cap) if n is not None), default=None)
        if (cap is not None or self.guard.remeasuring) and num_rows >= self.min_rows and limit is not None:
            # A fixed-length arm (and the first round of a held bucket's explored burst) verifies every row's drafts
            # up to the cap, whatever the cost model says: its rounds measure what adaflash@cap realises. (While a
            # bucket is held the cost model's wider entries go stale, and letting it choose would make exploring
            # rounds verify nothing, prove nothing and keep the hold.) Rows whose first draft is hardly ever accepted
            # (``row_min_rate``, their trust counted) verify only their anchor.
            lengths = torch.full((num_rows,), min(limit, rates.shape[1] + 1), dtype=torch.long)
            if rates.shape[1]:
                lengths[rates[:, 0].float().cpu() < self.row_min_rate] = 1
        elif self.ragged and num_rows > 1:
            lengths = ragged_verify_lens(rates, cost_model, limit)
        else:
            lengths = torch.full((num_rows,), goodput_verify_len(rates, cost_model, limit), dtype=torch.long)
        if (
            self.max_row_slowdown is not None
            and num_rows >= max(self.min_rows, self.slowdown_min_rows)
            and cost_model.measured
            and not self.guard.remeasuring  # the round re-measures wide forwards the held bucket forgot
        ):  # no request decodes slower than under plain steps by more than max_row_slowdown (its tail latency)
            drafter = self.drafter_cost(num_rows) if self.drafter_cost and draft_hidden_states is not None else None
            extra = self.proposal_overhead(num_rows) if self.proposal_overhead else None
            overhead = (drafter or 0.0) + (extra or 0.0)
            slack = self.pace.slack(rows) if self.row_slack and rows is not None and len(rows) == num_rows else None
            lengths = within_slowdown(lengths, rates, cost_model, self.max_row_slowdown, overhead, self.ragged, slack)
        return lengths

    def update(
        self,
        accept_lengths: torch.Tensor,
        verify_lens: torch.Tensor,
        seconds: float,
        proposed: bool | None = None,
        rows: Sequence[Hashable] | None = None,
    ) -> None:
        """File what the round realised, tokens per row and its time in plain steps of that many rows, with the
        guard and, for a speculative round of ``min_rows`` rows or more, under the arm it ran. With the row ids
        (``rows``) each row's trust learns what its drafts got, and the guard what each row realised (its tail
        check). ``round_log``, when set, gets each round as the guard sees it (``adaflash bench --round-log``)."""
        if seconds <= 0 or not len(verify_lens):
            return
        row_ids, (rated, estimates) = rows, self._round_rates or (None, None)
        self._round_rates = None
        if row_ids is not None and rated == list(row_ids):
            self.trust.update(row_ids, estimates, (verify_lens - 1).tolist(), accept_lengths.tolist())
        rows = len(verify_lens)
        # A round that proposed is a speculative attempt even where every row then verified only its anchor:
        # it paid for the proposals (filed as a plain step it would make plain steps look slower than they are).
        speculative = bool((verify_lens > 1).any()) if proposed is None else proposed
        bucket = rows.bit_length()
        measured = self.cost_model is not None and (self.cost_model.seconds or self.cost_model.batch_seconds)
        plain_step = self.cost_model.cost_batch(rows, 1) if measured else 1.0
        tokens, steps = float((accept_lengths + 1).sum()) / rows, seconds / plain_step
        if self.round_log is not None:  # what the guard is about to see, for replaying rules offline
            record = {"rows": rows, "proposed": speculative, "tokens": tokens, "steps": steps, "seconds": seconds}
            self.round_log({**record, **self.guard.round_state(bucket)})
        self.guard.record(bucket, speculative, tokens, steps, self.bandit.best_rate(bucket))
        if row_ids is not None and len(row_ids) == rows:
            if self.max_row_slowdown is not None and self.row_slack:  # only the opt-in bound reads the pace
                self.pace.update(row_ids, (accept_lengths + 1).tolist(), steps)
            if speculative and rows >= self.min_rows:
                self.guard.record_rows(bucket, row_ids, (accept_lengths + 1).tolist(), steps)
        used, self._used_cap = self._used_cap, None
        # A re-measuring round verifies up to a cap without the slowdown bound: not what its arm runs otherwise.
        remeasured = self.guard.remeasuring
        if (
            speculative
            and rows >= self.min_rows
            and self.caps
            and used is not None
            and used[0] == rows
            and not remeasured
        ):
            self.bandit.record(bucket, used[1], tokens, steps)
        self.guard.ran(bucket, speculative)


class LengthHeadVerifyLength(GoodputVerifyLength):
    """:class:`GoodputVerifyLength` with the drafter rows' rates predicted by an adaptive length head.

    For every row whose drafts came from the drafter, the estimated rates are replaced by the
    head's conditional acceptance rates, read from that row's drafter hidden states with the estimated
    rates as the head's prior (:class:`~adaflash_hf.modeling_length_head.AdaFlashLengthHead`); suffix
    rows keep the estimator's. ``sources=None`` (an engine that does not pass them) means every row
    drafted with the drafter whenever the drafter ran, which is exact with ``DraftingConfig.only("drafter")``.

    A subclass, so the engine binds its measured cost model exactly as for the goodput policy.
    """

    def __init__(
        self, head: AdaFlashLengthHead, cost_model: VerifyCostModel | None = None, max_verify_len: int | None = None
    ):
        super().__init__(max_verify_len=max_verify_len, cost_model=cost_model)
        self.head = head
        self.failed_rows: list[int] = []  # rows the head failed in the last verify_lens: they verify only their anchor

    def head_rates(
        self, rates: torch.Tensor, draft_hidden_states: torch.Tensor | None, sources: list[str] | None = None
    ) -> torch.Tensor:
        """rates (b, m) with the drafter rows' first B - 1 entries replaced by the head's predictions."""
        if draft_hidden_states is None:
            return rates
        rows = list(range(rates.shape[0])) if sources is None else [i for i, s in enumerate(sources) if s == "drafter"]
        if not rows:
            return rates
        head = self.head
        index = torch.tensor(rows, device=draft_hidden_states.device)
        hidden = draft_hidden_states.index_select(0, index).to(device=head.device, dtype=head.dtype)  # (r, B, H)
        num_drafts = hidden.shape[1] - 1
        n = min(num_drafts, rates.shape[1])
        rates = rates.float().cpu().clone()
        prior = torch.zeros(len(rows), num_drafts)  # (r, B - 1): the estimator's rates, 0 past a proposal
        prior[:, :n] = rates[rows, :n]
        try:
            with torch.inference_mode():
                predicted = head(hidden, prior.to(head.device)).rates.float().cpu()  # (r, B - 1)
            failed = ~torch.isfinite(predicted).all(-1)  # (r,)
            if failed.any():
                logger.warning(
                    "The length head gave non-finite rates to %d rows; they take a plain step.", int(failed.sum())
                )
        except Exception:  # a failing head costs its rows their drafts this round, never the request
            logger.warning(
                "The length head failed this round; its %d rows take a plain step.", len(rows), exc_info=True
            )
            predicted, failed = torch.zeros(len(rows), num_drafts), torch.ones(len(rows), dtype=torch.bool)
        if failed.any():
            self.failed_rows = [rows[k] for k in failed.nonzero().flatten().tolist()]
            predicted = predicted.masked_fill(failed[:, None], 0.0)
        rates[rows, :n] = predicted[:, :n]
        return rates

    def verify_lens(
        self,
        rates: torch.Tensor,
        draft_hidden_states: torch.Tensor | None,
        sources: list[str] | None = None,
        rows: Sequence[Hashable] | None = None,
    ) -> torch.Tensor:
        self.failed_rows = []
        if self._round_cap is not None and rates.shape[0] >= self.min_rows:  # a fixed-length arm: no estimate needed
            return super().verify_lens(rates, draft_hidden_states, sources, rows)
        head_rates = self.head_rates(rates, draft_hidden_states, sources)
        lengths = super().verify_lens(head_rates, draft_hidden_states, sources, rows)
        if self.failed_rows:
            lengths[self.failed_rows] = 1
        return lengths
