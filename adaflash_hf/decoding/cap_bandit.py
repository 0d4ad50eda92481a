"""The verify-length arms of the goodput policy: for each batch size, the goodput choice (``None``) or a fixed
length ``cap`` (one of ``caps``) at which every row verifies its drafts up to ``cap`` tokens, as ``adaflash@cap``
does.

Every speculative round of enough rows runs the arm whose rounds have realised the most tokens per plain step's
time in its batch-size bucket; each untried arm gets a round first, and every ``cap_explore_every``-th
speculative round tries another in turn (an arm realising under ``cap_prune`` of the best only every
``cap_prune_every``-th such turn). Where the cost model and the acceptance estimates are right the goodput choice
wins; where they are off at a load (a cost table learnt from few, noisy forwards, which at 4 rows made it verify
only the anchor of 10-74 % of the rows in measured probes), a fixed length wins, so the policy realises at least
what the best of ``adaflash@cap`` does, less what exploring the other arms costs.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CapBandit:
    caps: tuple[int, ...] = (4, 2)
    cap_explore_every: int = 8
    cap_prune: float = 0.85
    cap_prune_every: int = 4
    min_cap_steps: float = 4.0
    decay: float = 0.9
    capped: dict = field(default_factory=dict)  # (rows bucket, cap or None) -> [decayed tokens, decayed time]
    rounds: dict = field(default_factory=dict)  # rows bucket -> speculative rounds filed by cap

    def cap_rate(self, bucket: int, cap: int | None) -> float | None:
        """Realised tokens per row per plain step's time of the speculative rounds verified under ``cap``."""
        sums = self.capped.get((bucket, cap))
        return None if sums is None or sums[1] <= 0 else sums[0] / sums[1]

    def best_rate(self, bucket: int) -> float | None:
        """What this bucket's speculative rounds realise under their best arm, which is what :meth:`choose` mostly
        runs (the arms explored beside it must not make speculation as a whole look worse than it is); only arms
        with at least ``min_cap_steps`` plain steps' worth of decayed evidence compete, so one lucky round cannot
        stand for an arm. None without such evidence."""
        rates = [
            sums[0] / sums[1] for (b, _), sums in self.capped.items() if b == bucket and sums[1] >= self.min_cap_steps
        ]
        return max(rates) if rates else None

    def choose(self, bucket: int) -> int | None:
        """The arm of this bucket's next speculative round (None: the goodput choice; a number: that fixed length):
        an untried one first, then the best realised one, and every ``cap_explore_every``-th round another in turn.
        Arms that realise less than ``cap_prune`` of the best take only every ``cap_prune_every``-th of those turns
        (successive elimination): a goodput round of 16 rows can verify 17 tokens a row and cost five plain steps,
        so retrying a clearly worse arm as often as a close one costs more than it can teach."""
        arms = (None, *self.caps)
        untried = [cap for cap in arms if (bucket, cap) not in self.capped]
        if untried:
            return untried[0]
        best = max(arms, key=lambda cap: self.cap_rate(bucket, cap))
        n = self.rounds.get(bucket, 0)
        if n % self.cap_explore_every == self.cap_explore_every - 1:
            turn = n // self.cap_explore_every
            others = [cap for cap in arms if cap != best]
            if turn % self.cap_prune_every:  # most turns: only the arms close to the best
                others = [
                    cap for cap in others if self.cap_rate(bucket, cap) >= self.cap_prune * self.cap_rate(bucket, best)
                ]
            return others[turn % len(others)] if others else best
        return best

    def record(self, bucket: int, cap: int | None, tokens: float, steps: float) -> None:
        """File a speculative round verified under ``cap``: ``tokens`` per row in ``steps`` plain steps' time."""
        for key in [k for k in self.capped if k[0] == bucket]:  # every arm's evidence ages with the bucket's rounds
            self.capped[key] = [self.decay * x for x in self.capped[key]]
        filed = self.capped.setdefault((bucket, cap), [0.0, 0.0])
        filed[0] += tokens
        filed[1] += steps
        self.rounds[bucket] = self.rounds.get(bucket, 0) + 1
