"""Verify-length policies: how many tokens the target verifies per row in each round.

``verify_len`` counts the anchor (last accepted token) plus the drafts checked, so a policy returns
values in [1, m + 1] for a proposal of m drafts, and a row verifies ``verify_len - 1`` drafts (1 is a
plain decode step). The engine runs one target forward over every row's verify length: rows packed
into one ("ragged", so the linear layers see only the real tokens) where the target runs SDPA
attention, else padded to the longest row.

A policy sees the estimated conditional acceptance of every proposed draft, the drafter's hidden
states for the block (the adaptive length head reads them) and, optionally, where each row's drafts
came from; it is told what each round cost and accepted, so it can adapt to the machine and the load.
"""

from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

from .cost import VerifyCostModel

if TYPE_CHECKING:
    from ..modeling_length_head import AdaFlashLengthHead


class VerifyLengthPolicy(Protocol):
    def verify_lens(
        self, rates: torch.Tensor, draft_hidden_states: torch.Tensor | None, sources: list[str] | None = None
    ) -> torch.Tensor:
        """rates (b, m) estimated P(accept draft k | drafts < k accepted), 0 past a row's proposal;
        draft_hidden_states (b, B, H) or None when no drafter ran; sources per row ("drafter", "suffix",
        "global", "datastore", "tree" for a draft tree of several sources, or "none"), None when unknown
        -> verify_len (b,) long in [1, m + 1]. A draft tree's rates are those of its nodes in order
        (:func:`~.tree.chain_rates`), so a verify length keeps its likeliest nodes."""

    def update(self, accept_lengths: torch.Tensor, verify_lens: torch.Tensor, seconds: float,
               proposed: bool | None = None) -> None:
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


def verify_limit(policy: VerifyLengthPolicy) -> int | None:
    """The most tokens (anchor included) a row may verify in the round :func:`wants_drafts` just allowed, as the
    policy knows it before anything is proposed (a fixed length, or the verify-length arm it chose); None where
    it decides only once it sees the proposal. Proposals are cut to it, so look-ups and the draft head do no
    work past what the round can verify."""
    ask = getattr(policy, "round_verify_limit", None)
    return None if ask is None else ask()


@functools.cache
def _takes_proposed(update) -> bool:
    return "proposed" in inspect.signature(update).parameters


def report_round(policy: VerifyLengthPolicy, accept_lengths: torch.Tensor, verify_lens: torch.Tensor, seconds: float,
                 proposed: bool) -> None:
    """``policy.update`` after a round, with ``proposed`` where the policy's ``update`` takes it (policies
    written against the three-argument form keep working)."""
    if _takes_proposed(type(policy).update):
        policy.update(accept_lengths, verify_lens, seconds, proposed=proposed)
    else:
        policy.update(accept_lengths, verify_lens, seconds)


def goodput_verify_len(rates: torch.Tensor, cost_model: VerifyCostModel, max_verify_len: int | None = None) -> int:
    """The verify length g + 1 that maximises the batch's expected tokens per second.

    rates (b, m) conditional acceptance rates. Expected tokens of the batch when every row verifies
    g drafts: sum over rows of 1 + sum_{k<=g} prod_{j<=k} a_j (DESIGN §2); cost: one forward over
    b * (g + 1) new tokens. The forward is rectangular, so one g serves the whole batch.
    """
    b, m = rates.shape
    if max_verify_len is not None:
        m = min(m, max_verify_len - 1)
    expected = torch.cat([torch.zeros(b, 1), rates[:, :m].float().cpu().cumprod(-1).cumsum(-1)], dim=1)  # (b, m + 1): E[g]
    tokens = (1 + expected).sum(0)  # (m + 1,) expected tokens of the batch for g = 0..m
    costs = torch.tensor([cost_model.cost_batch(b, g + 1) for g in range(m + 1)])
    return int((tokens / costs).argmax()) + 1


MIN_GAIN = 0.02  # a draft less likely than this to be accepted never pays for its verification


def ragged_verify_lens(rates: torch.Tensor, cost_model: VerifyCostModel, max_verify_len: int | None = None) -> torch.Tensor:
    """Per-row verify lengths that maximise the batch's expected tokens per second in a ragged forward.

    rates (b, m) conditional acceptance rates -> (b,) verify lengths in [1, m + 1]. Draft k of row i
    adds prod_{j<=k} a_ij expected tokens, which never grows with k, so for any number of drafts in
    all the best set takes the likeliest drafts across rows, each row a prefix (DESIGN §2); the total
    is then chosen against the measured cost of a ragged forward of that many tokens
    (:meth:`VerifyCostModel.cost_ragged`). Rows whose drafts are unlikely verify only their anchor.
    """
    b, m = rates.shape
    if max_verify_len is not None:
        m = min(m, max_verify_len - 1)
    lengths = torch.ones(b, dtype=torch.long)
    if m < 1:
        return lengths
    gains = rates[:, :m].float().cpu().clamp(0, 1).cumprod(-1).flatten()  # (b * m,), row-major
    values, order = gains.sort(descending=True, stable=True)  # equal gains keep position order: prefixes per row
    n = int((values > MIN_GAIN).sum())
    if n == 0:
        return lengths
    tokens = b + torch.cat([torch.zeros(1), values[:n].cumsum(0)])  # (n + 1,) expected tokens with the top j drafts
    costs = cost_model.cost_ragged_curve(b, range(b, b + n + 1)).float()
    best = int((tokens / costs).argmax())
    return lengths + torch.bincount(order[:best] // m, minlength=b)


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

    def update(self, accept_lengths: torch.Tensor, verify_lens: torch.Tensor, seconds: float,
               proposed: bool | None = None) -> None:
        pass


@dataclass
class GoodputVerifyLength:
    """Maximise expected tokens per second: sum over rows of (1 + E[accepted | g drafts]) / cost(b rows, g + 1).

    E comes from the proposal's estimated acceptance rates; cost from a :class:`VerifyCostModel`, measured
    on this machine as rounds run (the engine binds the drafting state's model when none is given). g = 0
    (a plain step) wins when no draft is likely enough to pay for a longer forward. The forward is
    rectangular, so one g serves the whole batch; where the engine runs ragged forwards (``ragged``,
    set by the engine for SDPA targets) each row gets its own length (:func:`ragged_verify_lens`).

    A guard checks the model against what rounds actually deliver, before anything is proposed
    (:meth:`wants_drafts`). For each batch size (bucketed by powers of two) it keeps what whole rounds
    realised (proposal, drafter, verification and bookkeeping), plain steps and speculative rounds
    apart: tokens per row over time in units of the measured plain step of that many rows, as decayed
    sums over the last dozen or so rounds, so rounds of 9 and of 15 rows compare in one bucket. While
    speculative rounds deliver less than plain steps (``margin`` in their favour, and counting what they cost a
    larger batch beyond their own time, :meth:`desync_cost`) the round is a plain step
    that proposes nothing, so neither the drafter nor the look-ups are paid for; every
    ``explore_every`` rounds it speculates anyway, to notice when that changes. While a bucket loses, explored
    rounds come far enough apart that they waste under ``explore_budget`` of the time, up to
    ``max_explore_every`` rounds (an explored round at high load can cost several plain steps); the waste is
    sized from the bucket's rates, not from one round's, and only after ``min_evidence`` speculative rounds
    there (a bucket's first rounds pay kernel set-up for new shapes), so one unlucky round cannot hold plain
    steps for long. Every ``refresh_plain_every`` rounds it times a plain step; a bucket without a plain
    step of its own borrows the nearest bucket's. Explored speculation and refreshed plain steps each run
    ``burst_rounds`` rounds in a row, since the rate of a kind the guard rarely runs rests on its latest
    rounds, and a single round's time and acceptance are too noisy to flip the decision on. The engine reports
    a round that resumes drafting without the drafter's catching up on the context held back meanwhile
    (:func:`~adaflash_hf.decoding.state.catch_up_seconds`). So on a machine where verification costs as much per token as
    decoding (a saturated CPU at high load) it falls back to plain decoding instead of trusting an
    estimate that is off. It watches batches of at least ``min_rows`` rows: a single request's
    rounds are too few and too varied to compare, and there the goodput choice alone decides.

    The same realised rates also pick the verify rule of each batch size, among arms: the goodput choice
    (``None``), or a fixed length ``cap`` (one of ``caps``) at which every row verifies its drafts up to
    ``cap`` tokens, as ``adaflash@cap`` does. Every speculative round of ``min_rows`` rows or more runs the arm
    whose rounds have realised the most tokens per plain step's time in this bucket; each untried arm gets a
    round first, and every ``cap_explore_every``-th speculative round tries another in turn (an arm realising
    under ``cap_prune`` of the best only every ``cap_prune_every``-th such turn). Where the cost model and the
    acceptance estimates are right the goodput choice wins; where they are off at a load (a cost table learnt
    from few, noisy forwards, which at 4 rows made it verify only the anchor of 10-74 % of the rows in session 18's probes),
    a fixed length wins, so the policy realises at least what the best of ``adaflash@cap`` does, less what
    exploring the other arms costs, and the guard compares plain steps with that arm's rounds.
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
    realised: dict = field(default_factory=dict, repr=False)  # (rows bucket, speculative?) -> [decayed tokens, decayed time]
    _since: dict = field(default_factory=dict, repr=False)  # (rows bucket, speculative?) -> rounds since that kind ran
    _explore: dict = field(default_factory=dict, repr=False)  # rows bucket -> rounds between explored speculative rounds
    _burst: dict = field(default_factory=dict, repr=False)  # rows bucket -> (speculative?, rounds of it still to run)
    _spec_rounds: dict = field(default_factory=dict, repr=False)  # rows bucket -> speculative rounds seen
    capped: dict = field(default_factory=dict, repr=False)  # (rows bucket, cap or None) -> [decayed tokens, decayed time]
    _cap_rounds: dict = field(default_factory=dict, repr=False)  # rows bucket -> speculative rounds filed by cap
    _round_cap: int | None = field(default=None, repr=False)  # the cap wants_drafts chose for the round it allowed
    _used_cap: tuple | None = field(default=None, repr=False)  # (rows, cap) verify_lens applied, for update to file
    _exploring: bool = field(default=False, repr=False)  # whether the round wants_drafts allowed explores a held bucket

    def __post_init__(self):
        if self.burst_rounds < 1:
            raise ValueError(f"burst_rounds={self.burst_rounds}: must be >= 1.")
        if any(cap < 2 for cap in self.caps) or self.cap_explore_every < 2 or self.cap_prune_every < 1:
            raise ValueError(f"caps={self.caps}, cap_explore_every={self.cap_explore_every}, cap_prune_every="
                             f"{self.cap_prune_every}: each cap must be >= 2 (the anchor and at least one draft), "
                             "cap_explore_every >= 2 and cap_prune_every >= 1.")

    def rate(self, bucket: int, speculative: bool) -> float | None:
        """Realised tokens per row per plain step's time of one kind of round in a batch-size bucket.

        Plain steps make one token per row whatever the batch size, so where a bucket has no plain
        step measured yet the nearest bucket's plain rate stands in for it.
        """
        sums = self.realised.get((bucket, speculative))
        if sums is None and not speculative:
            measured = sorted((abs(b - bucket), b) for b, spec in self.realised if not spec)
            sums = self.realised[(measured[0][1], False)] if measured else None
        return None if sums is None else sums[0] / sums[1]

    def desync_cost(self, bucket: int) -> float:
        """The factor by which a speculative round of this bucket costs more than its own time shows: 1 plus
        ``desync_per_row`` for every row past the first of the bucket's smallest batch (1.0, 1.024, 1.056, 1.12, 1.248
        at 1, 4, 8, 16, 32 rows by default). Speculation desynchronises rows: they finish at different rounds, so
        joining requests prefill in smaller groups and rounds run with fewer rows, which no single round's time shows
        (session 16 measured about 10 % of a served level at 16 rows on a 2-core CPU)."""
        rows = 1 << max(bucket - 1, 0)
        return 1 + self.desync_per_row * (rows - 1)

    def speculative_rate(self, bucket: int) -> float | None:
        """What this bucket's speculative rounds realise under their best verify-length cap, which is what
        :meth:`choose_cap` mostly runs (the caps explored beside it must not make speculation as a whole look worse
        than it is); only caps with at least ``min_cap_steps`` plain steps' worth of decayed evidence compete, so one
        lucky round cannot stand for a cap. Without such evidence, every speculative round's rate."""
        rates = [sums[0] / sums[1] for (b, _), sums in self.capped.items() if b == bucket and sums[1] >= self.min_cap_steps]
        return max(rates) if rates else self.rate(bucket, True)

    def losing(self, bucket: int) -> bool:
        """Whether speculative rounds of this bucket, under their best cap, realise less than plain steps, their
        :meth:`desync_cost` counted (``margin`` in speculation's favour)."""
        return self._loses(bucket, self.rate(bucket, False), self.speculative_rate(bucket))

    def _loses(self, bucket: int, plain: float | None, spec: float | None) -> bool:
        return plain is not None and spec is not None and spec * self.margin < plain * self.desync_cost(bucket)

    def cap_rate(self, bucket: int, cap: int | None) -> float | None:
        """Realised tokens per row per plain step's time of the speculative rounds verified under ``cap``."""
        sums = self.capped.get((bucket, cap))
        return None if sums is None or sums[1] <= 0 else sums[0] / sums[1]

    def choose_cap(self, bucket: int) -> int | None:
        """The verify-length arm of this bucket's next speculative round (None: the goodput choice; a number: that
        fixed length): an untried one first, then the best realised one, and every ``cap_explore_every``-th round
        another in turn. Arms that realise less than ``cap_prune`` of the best take only every ``cap_prune_every``-th
        of those turns (successive elimination): a goodput round of 16 rows can verify 17 tokens a row and cost five
        plain steps, so retrying a clearly worse arm as often as a close one costs more than it can teach."""
        arms = (None, *self.caps)
        untried = [cap for cap in arms if (bucket, cap) not in self.capped]
        if untried:
            return untried[0]
        best = max(arms, key=lambda cap: self.cap_rate(bucket, cap))
        n = self._cap_rounds.get(bucket, 0)
        if n % self.cap_explore_every == self.cap_explore_every - 1:
            turn = n // self.cap_explore_every
            others = [cap for cap in arms if cap != best]
            if turn % self.cap_prune_every:  # most turns: only the arms close to the best
                others = [cap for cap in others if self.cap_rate(bucket, cap) >= self.cap_prune * self.cap_rate(bucket, best)]
            return others[turn % len(others)] if others else best
        return best

    def wants_drafts(self, rows: int) -> bool:
        """Whether this round proposes: False while speculative rounds of this batch size realise fewer
        tokens per second than plain steps (an explored speculative round keeps that evidence fresh,
        less often the longer it keeps losing), right after the first speculative round of a batch
        size, and once every ``refresh_plain_every`` rounds to time a plain step. A round it allows also
        gets its verify-length arm (:meth:`choose_cap`)."""
        self._exploring = False
        proposing = self._guard(rows)
        self._round_cap = self.choose_cap(rows.bit_length()) if proposing and rows >= self.min_rows and self.caps else None
        if self._exploring and self._round_cap is None and self.caps:
            self._round_cap = max(self.caps)  # an explored round verifies up to a cap, whatever the cost model says
        return proposing

    def round_verify_limit(self) -> int | None:
        """The round's arm (chosen by :meth:`wants_drafts`) or ``max_verify_len``, whichever is shorter."""
        return min((n for n in (self.max_verify_len, self._round_cap) if n is not None), default=None)

    def _guard(self, rows: int) -> bool:
        if rows < self.min_rows:  # one request: the goodput choice alone decides (too few, too varied rounds to compare)
            return True
        bucket = rows.bit_length()  # batch sizes 1, 2-3, 4-7, 8-15, ...
        kind, left, exploring = self._burst.get(bucket, (None, 0, False))
        if left > 0:  # finishing a run of explored (or refreshing plain) rounds: one round is too noisy to judge by
            self._burst[bucket] = (kind, left - 1, exploring)
            self._exploring = exploring
            return kind
        if self.rate(bucket, True) is not None and (bucket, False) not in self.realised:
            return self._start_burst(bucket, False)  # speculated at this size but never timed a plain step here: time some now
        if self.losing(bucket):
            if self._since.get((bucket, True), 0) + 1 >= self._explore.get(bucket, self.explore_every):
                self._exploring = True
                return self._start_burst(bucket, True, exploring=True)
            return False
        if self.rate(bucket, True) is None or self._since.get((bucket, False), 0) + 1 < self.refresh_plain_every:
            return True
        return self._start_burst(bucket, False)

    def _start_burst(self, bucket: int, speculative: bool, exploring: bool = False) -> bool:
        """Run ``burst_rounds`` rounds of this kind in a row (this one included) and answer for this one."""
        self._burst[bucket] = (speculative, self.burst_rounds - 1, exploring)
        return speculative

    def verify_lens(
        self, rates: torch.Tensor, draft_hidden_states: torch.Tensor | None, sources: list[str] | None = None
    ) -> torch.Tensor:
        cost_model = self.cost_model or VerifyCostModel()
        rows, cap = rates.shape[0], self._round_cap
        self._round_cap = None
        if rows < self.min_rows:
            cap = None
        self._used_cap = (rows, cap)
        limit = min((n for n in (self.max_verify_len, cap) if n is not None), default=None)
        if (cap is not None or self._exploring) and rows >= self.min_rows and limit is not None:
            # A fixed-length arm (and any explored round of a held bucket) verifies every row's drafts up to the
            # cap, whatever the cost model says: its rounds measure what adaflash@cap realises. (While a bucket is
            # held the cost model's wider entries go stale, and letting it choose would make exploring rounds
            # verify nothing, prove nothing and keep the hold.)
            return torch.full((rows,), min(limit, rates.shape[1] + 1), dtype=torch.long)
        if self.ragged and rows > 1:
            return ragged_verify_lens(rates, cost_model, limit)
        length = goodput_verify_len(rates, cost_model, limit)
        return torch.full((rows,), length, dtype=torch.long)

    def update(self, accept_lengths: torch.Tensor, verify_lens: torch.Tensor, seconds: float,
               proposed: bool | None = None) -> None:
        """Record what the round realised: tokens per row, and its time in plain steps of that many rows.

        Both are decayed sums (``decay`` per round of the bucket, whichever kind it was), so the rate
        is tokens over time across the last few dozen rounds, not an average of noisy per-round rates,
        and a kind the guard held back has its old evidence fade: the next explored round counts more
        (slow first rounds, such as kernel warm-up, cannot hold plain steps for long). The engine feeds
        the cost model itself."""
        if seconds <= 0 or not len(verify_lens):
            return
        rows = len(verify_lens)
        # A round that proposed is a speculative attempt even where every row then verified only its anchor:
        # it paid for the proposals (filed as a plain step it would make plain steps look slower than they are).
        speculative = bool((verify_lens > 1).any()) if proposed is None else proposed
        bucket = rows.bit_length()
        measured = self.cost_model is not None and (self.cost_model.seconds or self.cost_model.batch_seconds)
        plain_step = self.cost_model.cost_batch(rows, 1) if measured else 1.0
        for kind in (False, True):  # every round ages both kinds' evidence, so a held kind's old rounds fade
            if (bucket, kind) in self.realised:
                self.realised[(bucket, kind)] = [self.decay * x for x in self.realised[(bucket, kind)]]
        tokens, steps = float((accept_lengths + 1).sum()) / rows, seconds / plain_step
        sums = self.realised.setdefault((bucket, speculative), [0.0, 0.0])
        sums[0] += tokens
        sums[1] += steps
        plain = self.rate(bucket, False)
        if speculative and plain is not None:  # back off exploring while speculative rounds here lose
            self._spec_rounds[bucket] = self._spec_rounds.get(bucket, 0) + 1
            spec = self.speculative_rate(bucket)
            if self._loses(bucket, plain, spec) and self._spec_rounds[bucket] >= self.min_evidence:
                # Plain steps' worth of time a speculative round wastes, from the bucket's rates (one round's time and
                # acceptance are too noisy to set a long interval by), its desync included. A bucket's first
                # ``min_evidence`` speculative rounds keep exploring frequent (they pay kernel set-up for new shapes).
                lost = tokens * (self.desync_cost(bucket) / spec - 1 / plain)
                interval = max(self.explore_every, math.ceil(self.burst_rounds * lost / self.explore_budget))  # <= the budget
                self._explore[bucket] = min(interval, self.max_explore_every)
            else:
                self._explore[bucket] = self.explore_every
        used, self._used_cap = self._used_cap, None
        if speculative and rows >= self.min_rows and self.caps and used is not None and used[0] == rows:
            for key in [k for k in self.capped if k[0] == bucket]:  # every cap's evidence ages with the bucket's rounds
                self.capped[key] = [self.decay * x for x in self.capped[key]]
            filed = self.capped.setdefault((bucket, used[1]), [0.0, 0.0])
            filed[0] += tokens
            filed[1] += steps
            self._cap_rounds[bucket] = self._cap_rounds.get(bucket, 0) + 1
        self._since[(bucket, speculative)] = 0
        self._since[(bucket, not speculative)] = self._since.get((bucket, not speculative), 0) + 1


class LengthHeadVerifyLength(GoodputVerifyLength):
    """:class:`GoodputVerifyLength` with the drafter rows' rates predicted by an adaptive length head.

    For every row whose drafts came from the drafter, the estimated rates are replaced by the
    head's conditional acceptance rates, read from that row's drafter hidden states with the estimated
    rates as the head's prior (:class:`~adaflash_hf.modeling_length_head.AdaFlashLengthHead`); suffix
    rows keep the estimator's. ``sources=None`` (an engine that does not pass them) means every row
    drafted with the drafter whenever the drafter ran, which is exact with ``DraftingConfig.only("drafter")``.

    A subclass, so the engine binds its measured cost model exactly as for the goodput policy.
    """

    def __init__(self, head: AdaFlashLengthHead, cost_model: VerifyCostModel | None = None, max_verify_len: int | None = None):
        super().__init__(max_verify_len=max_verify_len, cost_model=cost_model)
        self.head = head

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
        with torch.inference_mode():
            predicted = head(hidden, prior.to(head.device)).rates.float().cpu()  # (r, B - 1)
        rates[rows, :n] = predicted[:, :n]
        return rates

    def verify_lens(
        self, rates: torch.Tensor, draft_hidden_states: torch.Tensor | None, sources: list[str] | None = None
    ) -> torch.Tensor:
        if self._round_cap is not None and rates.shape[0] >= self.min_rows:  # a fixed-length arm: no estimate needed
            return super().verify_lens(rates, draft_hidden_states, sources)
        return super().verify_lens(self.head_rates(rates, draft_hidden_states, sources), draft_hidden_states, sources)
