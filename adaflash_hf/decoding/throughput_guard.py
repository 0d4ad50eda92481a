"""The throughput guard of the goodput policy: plain steps while speculation delivers less than they do.

For each batch size (bucketed by powers of two) it keeps what whole rounds realised (proposal, drafter,
verification and bookkeeping), plain steps and speculative rounds apart: tokens per row over time in units of
the measured plain step of that many rows, as decayed sums over the last dozen or so rounds, so rounds of 9 and
of 15 rows compare in one bucket. While speculative rounds deliver less than plain steps (``margin`` in their
favour, and counting what they cost a larger batch beyond their own time, :meth:`ThroughputGuard.desync_cost`)
the round is a plain step that proposes nothing, so neither the drafter nor the look-ups are paid for; every
``explore_every`` rounds it speculates anyway, to notice when that changes. While a bucket loses, explored
rounds come far enough apart that they waste under ``explore_budget`` of the time, up to ``max_explore_every``
rounds (an explored round at high load can cost several plain steps); the waste is sized from the bucket's
rates, not from one round's, and only after ``min_evidence`` speculative rounds there (a bucket's first rounds
pay kernel set-up for new shapes), so one unlucky round cannot hold plain steps for long. Every
``refresh_plain_every`` rounds it times a plain step; a bucket without a plain step of its own borrows the
nearest bucket's. Explored speculation and refreshed plain steps each run ``burst_rounds`` rounds in a row,
since the rate of a kind the guard rarely runs rests on its latest rounds, and a single round's time and
acceptance are too noisy to flip the decision on. So on a machine where verification costs as much per token
as decoding (a saturated CPU at high load) the policy falls back to plain decoding instead of trusting an
estimate that is off. It watches batches of at least ``min_rows`` rows: a single request's rounds are too few
and too varied to compare.

The tail check (opt-in: ``tail_tolerance``): speculation that pays on average can still slow the requests it helps
least (in a round every row waits for the longest verification, so a row whose drafts fail pays for the others').
With it, the guard keeps what each of the last ``tail_rows`` rows realised in the speculative rounds of a bucket,
and holds the bucket while the row at ``tail_quantile`` of them (with ``tail_min_rounds`` such rounds or more)
realises less than plain steps by more than ``tail_tolerance``. It is off by default: a row's rate over a few
rounds is noisy, so the low quantile of many rows' rates sits below the true one, and on a 2-core CPU the check
held batches of 4 and 8 rows where speculation raised throughput by a third without lengthening p99 latency.

A held bucket resumes speculation only with confidence (``resume_z``): the explored rounds since the hold began (the
last ``resume_rounds`` of them, ``resume_min_rounds`` at least) must realise more than plain steps, their desync and
``margin`` counted, by ``resume_z`` standard errors of their pooled rate. Explored rounds are few and their
acceptance varies from round to round: judged by its decayed rate, one lucky round in a burst lifted the rate over
the bar and started an episode of speculation that lost until that round faded. The first round of an explored burst
re-measures (``remeasuring``: the policy verifies every row up to a cap there, to refresh the wide forwards a held
bucket's cost model forgot); the burst's other rounds run as speculation would if resumed, and only they count for
resuming (with ``burst_rounds`` 1, the one round counts): on a 2-core Xeon at 28-31 rows, rounds verified up to a
cap realised 1.44 times plain steps' rate, the policy's own rounds after them 1.07 times. A bucket that is
speculating is held as soon as its point estimate falls below the bar; with ``hold_z`` > 0 (opt-in) only once its
last ``resume_rounds`` speculative rounds also lose with that many standard errors of confidence, so that a few
rounds of bad acceptance do not hold a batch size where speculation pays.

Speculation is judged by the lower of two rates (:meth:`ThroughputGuard.speculative_rate`): ``spec_rate``, what its
rounds realise under their best verify-length cap (:class:`~.cap_bandit.CapBandit`), which the caller passes in, and
what its rounds realised as speculation runs, whichever arm (re-measuring rounds left out); the best of a few noisy
arms reads high.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field


@dataclass
class ThroughputGuard:
    margin: float = 1.02
    desync_per_row: float = 0.008
    explore_every: int = 16
    max_explore_every: int = 256
    explore_budget: float = 0.01
    burst_rounds: int = 3
    min_evidence: int = 8
    refresh_plain_every: int = 64
    decay: float = 0.9
    min_rows: int = 2
    tail_quantile: float = 0.1
    tail_tolerance: float | None = None
    tail_min_rounds: int = 6
    tail_rows: int = 64
    resume_z: float = 1.0
    resume_rounds: int = 12
    resume_min_rounds: int = 1
    hold_z: float = 0.0
    realised: dict = field(default_factory=dict)  # (rows bucket, speculative?) -> [decayed tokens, decayed time]
    since: dict = field(default_factory=dict)  # (rows bucket, speculative?) -> rounds since that kind ran
    explore: dict = field(default_factory=dict)  # rows bucket -> rounds between explored speculative rounds
    burst: dict = field(default_factory=dict)  # rows bucket -> (speculative?, rounds of it still to run, exploring?)
    spec_rounds: dict = field(default_factory=dict)  # rows bucket -> speculative rounds seen
    exploring: bool = False  # whether the round allows() just allowed explores a held bucket
    remeasuring: bool = False  # whether it is the first round of an explored burst (see the module's docstring)
    row_realised: dict = field(default_factory=dict)  # rows bucket -> OrderedDict(row -> [tokens, steps, rounds])
    held: dict = field(default_factory=dict)  # held rows bucket -> its explored rounds' (tokens, steps) since
    own: dict = field(default_factory=dict)  # rows bucket -> [decayed tokens, decayed time] of rounds not re-measuring
    recent: dict = field(default_factory=dict)  # rows bucket -> its last speculative rounds' (tokens, steps), as own

    def __post_init__(self):
        tolerance = self.tail_tolerance
        if not 0 <= self.tail_quantile <= 1 or (tolerance is not None and tolerance <= 0) or self.tail_rows < 1:
            raise ValueError(
                f"tail_quantile={self.tail_quantile}, tail_tolerance={tolerance}, tail_rows={self.tail_rows}: need "
                "0 <= tail_quantile <= 1, tail_tolerance None (no tail check) or > 0, and tail_rows >= 1."
            )
        if self.resume_z < 0 or self.hold_z < 0 or not 1 <= self.resume_min_rounds <= self.resume_rounds:
            raise ValueError(
                f"resume_z={self.resume_z}, hold_z={self.hold_z}, resume_min_rounds={self.resume_min_rounds}, "
                f"resume_rounds={self.resume_rounds}: need resume_z and hold_z >= 0 (0: the pooled rate alone) and "
                "1 <= resume_min_rounds <= resume_rounds."
            )

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
        (about 10 % of a served level at 16 rows, measured on a 2-core CPU)."""
        rows = 1 << max(bucket - 1, 0)
        return 1 + self.desync_per_row * (rows - 1)

    def own_rate(self, bucket: int) -> float | None:
        """What this bucket's speculative rounds realised as speculation runs (every round but re-measuring ones,
        whichever arm it ran), tokens over time of decayed sums; None before any."""
        sums = self.own.get(bucket)
        return None if sums is None or sums[1] <= 0 else sums[0] / sums[1]

    def speculative_rate(self, bucket: int, spec_rate: float | None) -> float | None:
        """The rate speculation is judged by: the lower of ``spec_rate`` (the best arm's) and :meth:`own_rate`. The
        best arm's rate is the largest of a few noisy ones, so on its own it reads high: at 16-31 rows on a 2-core
        Xeon it kept an episode speculating whose rounds realised 1.05 times plain steps' rate against a bar of
        1.10."""
        rates = [r for r in (spec_rate, self.own_rate(bucket)) if r is not None]
        return min(rates) if rates else self.rate(bucket, True)

    def losing(self, bucket: int, spec_rate: float | None) -> bool:
        """Whether speculative rounds of this bucket realise less than plain steps, their :meth:`desync_cost`
        counted (``margin`` in speculation's favour)."""
        return self.loses(bucket, self.rate(bucket, False), self.speculative_rate(bucket, spec_rate))

    def loses(self, bucket: int, plain: float | None, spec: float | None) -> bool:
        if plain is None or spec is None:
            return False
        floor = plain * self.desync_cost(bucket)
        tail = None if self.tail_tolerance is None else self.tail_rate(bucket)
        return spec * self.margin < floor or (tail is not None and tail * self.tail_tolerance < floor)

    def resume_bound(self, bucket: int) -> float | None:
        """The lower confidence bound (``resume_z`` standard errors) of what the explored rounds since this bucket's
        hold realised, tokens over time pooled; None before any (:func:`pooled_bound`)."""
        return pooled_bound(self.held.get(bucket), -self.resume_z)

    def confidently_losing(self, bucket: int, spec_rate: float | None) -> bool:
        """Whether a speculating bucket loses (:meth:`losing`) and, with ``hold_z`` > 0, its last speculative
        rounds' upper confidence bound (``hold_z`` standard errors) loses too."""
        if not self.losing(bucket, spec_rate):
            return False
        upper = pooled_bound(self.recent.get(bucket), self.hold_z) if self.hold_z > 0 else None
        return upper is None or self.loses(bucket, self.rate(bucket, False), upper)

    def proven(self, bucket: int) -> bool:
        """Whether the explored rounds since this bucket's hold beat plain steps with confidence (:meth:`resume_bound`
        against the plain rate, its desync and ``margin`` counted), from ``resume_min_rounds`` rounds or more."""
        if len(self.held.get(bucket) or ()) < self.resume_min_rounds:
            return False
        bound, plain = self.resume_bound(bucket), self.rate(bucket, False)
        return bound is not None and plain is not None and bound * self.margin >= plain * self.desync_cost(bucket)

    def record_rows(self, bucket: int, rows: Sequence[Hashable], tokens: Sequence[float], steps: float) -> None:
        """File a speculative round per row: row ``rows[i]`` gained ``tokens[i]`` in ``steps`` plain steps' time (kept
        only with the tail check on)."""
        if self.tail_tolerance is None:
            return
        table = self.row_realised.setdefault(bucket, OrderedDict())
        for row, gained in zip(rows, tokens):
            sums = table.pop(row, [0.0, 0.0, 0])
            table[row] = [sums[0] + gained, sums[1] + steps, sums[2] + 1]
        while len(table) > self.tail_rows:
            table.popitem(last=False)

    def tail_rate(self, bucket: int) -> float | None:
        """Tokens per plain step's time that the row at ``tail_quantile`` of this bucket's recent rows realised in its
        speculative rounds; None with fewer than 4 rows of ``tail_min_rounds`` such rounds."""
        table = self.row_realised.get(bucket) or {}
        rates = sorted(t / s for t, s, n in table.values() if n >= self.tail_min_rounds and s > 0)
        if len(rates) < 4:
            return None
        return rates[min(len(rates) - 1, int(self.tail_quantile * len(rates)))]

    def allows(self, rows: int, spec_rate: float | None) -> bool:
        """Whether a round of ``rows`` rows speculates; sets :attr:`exploring` when it explores a held bucket."""
        self.exploring = self.remeasuring = False
        if (
            rows < self.min_rows
        ):  # one request: the goodput choice alone decides (too few, too varied rounds to compare)
            return True
        bucket = rows.bit_length()  # batch sizes 1, 2-3, 4-7, 8-15, ...
        kind, left, exploring = self.burst.get(bucket, (None, 0, False))
        if left > 0:  # finishing a run of explored (or refreshing plain) rounds: one round is too noisy to judge by
            self.burst[bucket] = (kind, left - 1, exploring)
            self.exploring = exploring
            return kind
        if self.rate(bucket, True) is not None and (bucket, False) not in self.realised:
            return self._start_burst(
                bucket, False
            )  # speculated at this size but never timed a plain step here: time some now
        if bucket in self.held:  # held: resume only once explored rounds beat plain steps with confidence
            hold = not self.proven(bucket)
        else:  # speculating: hold as soon as the point estimate loses
            hold = self.confidently_losing(bucket, spec_rate)
            if hold:
                self.held[bucket] = deque(maxlen=self.resume_rounds)
        if not hold:
            self.held.pop(bucket, None)
        if hold:
            if self.since.get((bucket, True), 0) + 1 >= self.explore.get(bucket, self.explore_every):
                self.exploring = self.remeasuring = True
                return self._start_burst(bucket, True, exploring=True)
            return False
        if self.rate(bucket, True) is None or self.since.get((bucket, False), 0) + 1 < self.refresh_plain_every:
            return True
        return self._start_burst(bucket, False)

    def _start_burst(self, bucket: int, speculative: bool, exploring: bool = False) -> bool:
        """Run ``burst_rounds`` rounds of this kind in a row (this one included) and answer for this one."""
        self.burst[bucket] = (speculative, self.burst_rounds - 1, exploring)
        return speculative

    def record(self, bucket: int, speculative: bool, tokens: float, steps: float, spec_rate: float | None) -> None:
        """File a round: ``tokens`` per row in ``steps`` plain steps' time. Both are decayed sums (``decay`` per
        round of the bucket, whichever kind it was), so the rate is tokens over time across the last few dozen
        rounds, not an average of noisy per-round rates, and a kind the guard held back has its old evidence
        fade: the next explored round counts more (slow first rounds, such as kernel warm-up, cannot hold plain
        steps for long)."""
        for kind in (False, True):  # every round ages both kinds' evidence, so a held kind's old rounds fade
            if (bucket, kind) in self.realised:
                self.realised[(bucket, kind)] = [self.decay * x for x in self.realised[(bucket, kind)]]
        if bucket in self.own:
            self.own[bucket] = [self.decay * x for x in self.own[bucket]]
        sums = self.realised.setdefault((bucket, speculative), [0.0, 0.0])
        sums[0] += tokens
        sums[1] += steps
        if speculative and not self.remeasuring:
            own = self.own.setdefault(bucket, [0.0, 0.0])
            own[0] += tokens
            own[1] += steps
            self.recent.setdefault(bucket, deque(maxlen=self.resume_rounds)).append((tokens, steps))
        if speculative and bucket in self.held and (not self.remeasuring or self.burst_rounds == 1):
            self.held[bucket].append((tokens, steps))  # an explored round run as resumed speculation would run
        plain = self.rate(bucket, False)
        if speculative and plain is not None:  # back off exploring while speculative rounds here lose
            self.spec_rounds[bucket] = self.spec_rounds.get(bucket, 0) + 1
            spec = self.speculative_rate(bucket, spec_rate)
            if self.loses(bucket, plain, spec) and self.spec_rounds[bucket] >= self.min_evidence:
                # Plain steps' worth of time a speculative round wastes, from the bucket's rates (one round's time and
                # acceptance are too noisy to set a long interval by), its desync included. A bucket's first
                # ``min_evidence`` speculative rounds keep exploring frequent (they pay kernel set-up for new shapes).
                tail = None if self.tail_tolerance is None else self.tail_rate(bucket)  # held for its tail: what the
                # tail rows lose is the waste
                slowest = spec if tail is None else min(spec, tail)
                lost = tokens * (self.desync_cost(bucket) / slowest - 1 / plain)
                interval = max(
                    self.explore_every, math.ceil(self.burst_rounds * lost / self.explore_budget)
                )  # <= the budget
                self.explore[bucket] = min(interval, self.max_explore_every)
            else:
                self.explore[bucket] = self.explore_every

    def round_state(self, bucket: int) -> dict:
        """Where the guard stands on the round it is about to file: whether it explored a held bucket, re-measured,
        and whether the bucket is held (for round logs)."""
        return {"exploring": self.exploring, "remeasuring": self.remeasuring, "held": bucket in self.held}

    def ran(self, bucket: int, speculative: bool) -> None:
        """Count rounds since each kind last ran in this bucket."""
        self.since[(bucket, speculative)] = 0
        self.since[(bucket, not speculative)] = self.since.get((bucket, not speculative), 0) + 1


def pooled_bound(rounds: Sequence[tuple[float, float]] | None, z: float) -> float | None:
    """``rounds``' pooled rate (tokens over steps) plus ``z`` standard errors; None without rounds. The standard error
    is the ratio estimator's (residuals of tokens against the pooled rate times steps), scaled by n / (n - 1); one
    round, or ``z`` 0, gives the pooled rate."""
    if not rounds:
        return None
    tokens, steps = sum(t for t, _ in rounds), sum(s for _, s in rounds)
    rate, n = tokens / steps, len(rounds)
    if n < 2 or z == 0:
        return rate
    spread = sum((t - rate * s) ** 2 for t, s in rounds) * n / (n - 1)
    return rate + z * math.sqrt(spread) / steps
