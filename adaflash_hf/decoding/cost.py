"""Measured cost of a verification forward, by the number of new tokens it carries.

A plain decode step and a speculative verification are the same target forward with 1 or b*(g+1)
new tokens. On a GPU (and in bf16 on AMX CPUs) that cost is nearly flat up to tens of tokens; on other
CPUs it grows early. The model therefore measures instead of assuming: an exponential moving average
of the seconds per forward for each token count seen, and, for counts not seen yet, the nearest
measured smaller count scaled by a prior slope. Memory is bounded by the largest token count.
"""

from __future__ import annotations

import time

import torch


def synchronize(device: torch.device | str) -> None:
    """Wait for queued device work so wall-clock timings measure real compute (no-op on CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "xpu":
        torch.xpu.synchronize(device)


def timer(device: torch.device | str) -> float:
    synchronize(device)
    return time.perf_counter()


class VerifyCostModel:
    """Seconds of one target forward with ``n`` new tokens: measured EMA, prior slope where unmeasured."""

    def __init__(self, prior_slope: float = 0.03, decay: float = 0.2):
        self.prior_slope, self.decay = prior_slope, decay
        self.seconds: dict[int, float] = {}

    def update(self, num_tokens: int, seconds: float) -> None:
        old = self.seconds.get(num_tokens)
        self.seconds[num_tokens] = seconds if old is None else (1 - self.decay) * old + self.decay * seconds

    def cost(self, num_tokens: int) -> float:
        """Estimated seconds (or relative units before any measurement) of a forward with num_tokens new tokens."""
        if num_tokens in self.seconds:
            return self.seconds[num_tokens]
        below = [n for n in self.seconds if n < num_tokens]
        if below:
            n = max(below)
            return self.seconds[n] * (1 + self.prior_slope * (num_tokens - n))
        above = [n for n in self.seconds if n > num_tokens]
        if above:
            n = min(above)
            return self.seconds[n] / (1 + self.prior_slope * (n - num_tokens))
        return 1 + self.prior_slope * (num_tokens - 1)
