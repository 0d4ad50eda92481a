"""Statistics of paired pass/fail results: Wilson intervals, the exact McNemar test and Newcombe's paired interval.

The Wilson interval and the exact McNemar (sign) test are :func:`scipy.stats.binomtest`'s; scipy has no
interval for a paired difference of proportions, so Newcombe's is computed here from its Wilson intervals.
"""

from __future__ import annotations

import math


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a proportion (95% by default); (0, 1) when n is 0."""
    if n == 0:
        return 0.0, 1.0
    from scipy.stats import binomtest

    interval = binomtest(successes, n).proportion_ci(confidence_level=confidence, method="wilson")
    return max(0.0, float(interval.low)), min(1.0, float(interval.high))


def mcnemar_exact_p(first_only: int, second_only: int) -> float:
    """Two-sided exact McNemar (sign test) p-value from the discordant pairs; 1.0 when there are none."""
    if first_only + second_only == 0:
        return 1.0
    from scipy.stats import binomtest

    return min(1.0, float(binomtest(first_only, first_only + second_only, 0.5).pvalue))


def paired_difference_interval(
    both: int, first_only: int, second_only: int, neither: int, confidence: float = 0.95
) -> tuple[float, float]:
    """Newcombe's square-and-add interval for p_first - p_second on paired outcomes (95% by default).

    p_first = (both + first_only) / n and p_second = (both + second_only) / n; the Wilson intervals of
    the two are combined with the continuity-corrected correlation of the pairs (Newcombe 1998,
    method 10, as in Fagerland, Lydersen and Laake, "Statistical Analysis of Contingency Tables", ch. 8).
    """
    n = both + first_only + second_only + neither
    if n == 0:
        return -1.0, 1.0
    p1, p2 = (both + first_only) / n, (both + second_only) / n
    (l1, u1) = wilson_interval(both + first_only, n, confidence)
    (l2, u2) = wilson_interval(both + second_only, n, confidence)
    margins = (both + first_only) * (second_only + neither) * (both + second_only) * (first_only + neither)
    a = both * neither - first_only * second_only
    psi = 0.0 if margins == 0 or 0 <= a <= n / 2 else (a - n / 2 if a > 0 else a) / math.sqrt(margins)
    lower = p1 - p2 - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2 - 2 * psi * (p1 - l1) * (u2 - p2))
    upper = p1 - p2 + math.sqrt((p2 - l2) ** 2 + (u1 - p1) ** 2 - 2 * psi * (p2 - l2) * (u1 - p1))
    return max(-1.0, lower), min(1.0, upper)
