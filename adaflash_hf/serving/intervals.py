"""How sure a repeated benchmark is: percentile-bootstrap intervals over measured passes.

A pass is one measurement of every method at one load, the methods run back to back (interleaved), so a
slow drift of a shared machine moves all methods of a pass alike. An interval resamples whole passes with
replacement and recomputes a statistic on each resample; the 2.5th and 97.5th percentiles of those values
bound the 95 % interval. A statistic that involves several methods (a ratio of two methods' throughputs)
is computed on the same resampled pass indices for every method in it: the resampling is paired by pass,
so what a pass's drift did to both methods cancels in their ratio instead of widening the interval.

Statistics are functions of an array of pass indices, so the point estimate is the statistic of all
passes (``numpy.arange(passes)``) and is exactly the number a report prints beside the interval. The
seed is fixed, so the same passes always give the same interval. One pass cannot say how much passes
vary: its interval is unavailable (no bounds), not a zero-width interval that would look certain.

Only numpy is needed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 2000
SEED = 0
MIN_PASSES = 2  # one pass says nothing about how passes vary
RECOMMENDED_PASSES = 5  # what a claim on a small shared machine (2 cores) needs

Statistic = Callable[[np.ndarray], float]
"""A number computed from the passes at the given indices (repeated indices count repeatedly)."""


@dataclass(frozen=True)
class Interval:
    """A point estimate with its bootstrap interval; ``low`` and ``high`` are None with fewer than 2 passes."""

    estimate: float
    low: float | None
    high: float | None
    passes: int

    @property
    def available(self) -> bool:
        return self.low is not None and self.high is not None

    def to_dict(self) -> dict:
        return {"estimate": self.estimate, "low": self.low, "high": self.high}


def bootstrap_interval(
    statistic: Statistic,
    passes: int,
    *,
    resamples: int = RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = SEED,
) -> Interval:
    """The percentile-bootstrap interval of ``statistic`` over ``passes`` passes.

    Every resample draws ``passes`` pass indices with replacement from one generator seeded with ``seed``,
    so two calls with the same number of passes draw the same indices (and a ratio computed by one
    statistic sees the same passes in numerator and denominator). The interval is widened, if needed, to
    contain the point estimate, which a percentile interval of a skewed statistic can rarely miss.
    """
    if passes < 1:
        raise ValueError(f"an interval needs at least one pass, got {passes}.")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}.")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie strictly between 0 and 1 (e.g. 0.95), got {confidence}.")
    estimate = float(statistic(np.arange(passes)))
    if passes < MIN_PASSES:
        return Interval(estimate, None, None, passes)
    draws = np.random.default_rng(seed).integers(0, passes, size=(resamples, passes))
    values = np.array([statistic(indices) for indices in draws], dtype=float)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return Interval(estimate, min(float(low), estimate), max(float(high), estimate), passes)


def rate(amounts: Sequence[float], durations: Sequence[float]) -> Statistic:
    """Total amount over total duration of the chosen passes (tokens per second of all their requests)."""
    amounts, durations = np.asarray(amounts, dtype=float), np.asarray(durations, dtype=float)
    if amounts.shape != durations.shape:
        raise ValueError(f"rate needs one amount per duration, got {amounts.size} and {durations.size}.")

    def statistic(indices: np.ndarray) -> float:
        return float(amounts[indices].sum() / durations[indices].sum())

    return statistic


def pooled_percentile(values_by_pass: Sequence[Sequence[float]], q: float) -> Statistic:
    """The ``q``-th percentile of the chosen passes' values pooled (e.g. p99 latency of all their requests).

    Nearest rank, ``round(q / 100 * (n - 1))`` of the sorted pool, the rule the printed table uses, so the
    point estimate equals the table's pooled percentile."""
    arrays = [np.asarray([v for v in values if v is not None], dtype=float) for values in values_by_pass]
    if not all(array.size for array in arrays):
        raise ValueError("pooled_percentile needs at least one value in every pass.")

    def statistic(indices: np.ndarray) -> float:
        pool = np.sort(np.concatenate([arrays[i] for i in indices]))
        rank = min(pool.size - 1, max(0, round(q / 100 * (pool.size - 1))))
        return float(pool[rank])

    return statistic


def ratio(numerator: Statistic, denominator: Statistic) -> Statistic:
    """``numerator / denominator`` on the same pass indices (paired); a statistic over itself is exactly 1."""

    def statistic(indices: np.ndarray) -> float:
        if numerator is denominator:
            return 1.0
        return numerator(indices) / denominator(indices)

    return statistic
