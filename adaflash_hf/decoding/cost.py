"""Measured cost of a verification forward, by the number of new tokens it carries.

A plain decode step and a speculative verification are the same target forward with 1 or b*(g+1)
new tokens. On a GPU (and in bf16 on AMX CPUs) that cost is nearly flat up to tens of tokens; on other
CPUs it grows early. The model therefore measures instead of assuming: an exponential moving average
of the seconds per forward for each token count seen, and, for counts not seen yet, the nearest
measured smaller count scaled by a prior slope. Memory is bounded by the largest token count.

The tables stay monotone: a forward with more new tokens (or rows) never costs less than one with fewer.
Each fresh measurement wins over the entries it contradicts. Without that, an entry that is rarely
measured again (the one-token step, while the engine verifies trees) keeps the cost of slow first
rounds, and an inflated plain step makes every speculative choice look cheap.
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
    """Seconds of one target forward: by new tokens for one row, and by (rows, tokens per row) for batches.

    One row of n tokens and n rows of one token are not the same forward: every row attends over its
    own cache. So the model keeps three tables: ``seconds`` by token count (one row: batch-1 rounds and
    the start-up profile), ``row_seconds`` by rows for plain steps (profiled at start-up for serving),
    and ``batch_seconds`` by (rows, tokens per row) as batched rounds run. :meth:`cost_batch` answers
    from the last when it has the shape, else scales the plain step of that many rows by how the
    token count grows the one-row cost.
    """

    def __init__(self, prior_slope: float = 0.03, decay: float = 0.2):
        self.prior_slope, self.decay = prior_slope, decay
        self.seconds: dict[int, float] = {}
        self.row_seconds: dict[int, float] = {}
        self.batch_seconds: dict[tuple[int, int], float] = {}
        self.ragged_seconds: dict[int, dict[int, float]] = {}  # rows -> {new tokens in all: seconds}, ragged forwards

    @property
    def measured(self) -> bool:
        """Whether any forward has been timed yet (before that, costs are relative units, not seconds)."""
        return bool(self.seconds or self.row_seconds or self.batch_seconds or self.ragged_seconds)

    def _ema(self, table: dict, key, seconds: float) -> None:
        old = table.get(key)
        table[key] = seconds if old is None else (1 - self.decay) * old + self.decay * seconds

    def update(self, num_tokens: int, seconds: float, rows: int = 1, ragged: bool = False) -> None:
        """Feed a measured forward of ``rows`` rows with ``num_tokens`` new tokens in all (``ragged``: rows
        of different lengths packed into one, see :meth:`cost_ragged`)."""
        if ragged and rows > 1:
            table = self.ragged_seconds.setdefault(rows, {})
            self._ema(table, num_tokens, seconds)
            keep_monotone(table, num_tokens)
        elif rows <= 1:
            self._ema(self.seconds, num_tokens, seconds)
            keep_monotone(self.seconds, num_tokens)
        else:
            width = num_tokens // rows
            self._ema(self.batch_seconds, (rows, width), seconds)
            same_rows = {w: t for (r, w), t in self.batch_seconds.items() if r == rows}
            keep_monotone(same_rows, width)
            self.batch_seconds.update({(rows, w): t for w, t in same_rows.items()})
            if num_tokens == rows:
                self._ema(self.row_seconds, rows, seconds)
                keep_monotone(self.row_seconds, rows)

    def cost_batch(self, rows: int, width: int) -> float:
        """Estimated seconds of a forward of ``rows`` rows with ``width`` new tokens each.

        A measured shape answers directly. Otherwise, where forwards of this width were measured at
        two or more row counts (the start-up profile measures several), the answer is interpolated
        along rows at this width; failing that, the plain step of that many rows is scaled by how
        the token count grows the one-row cost.
        """
        if rows <= 1:
            return self.cost(width)
        measured = self.batch_seconds.get((rows, width))
        if measured is not None:
            return measured
        same_width = {r: t for (r, w), t in self.batch_seconds.items() if w == width}
        if len(same_width) >= 2 and min(same_width) <= rows:
            return interpolate(same_width, rows)
        base = interpolate(self.row_seconds, rows) if self.row_seconds else self.cost(rows)
        return base * self.cost(rows * width) / self.cost(rows)

    def cost_ragged(self, rows: int, num_tokens: int) -> float:
        """Estimated seconds of a ragged forward: ``rows`` rows with ``num_tokens`` new tokens in all, packed
        so that the linear layers see only those tokens.

        Interpolated along the ragged forwards measured at this many rows once there are two; before that,
        a rectangular forward of the same tokens per row (rounded up), which costs at least as much.
        """
        if rows <= 1:
            return self.cost(num_tokens)
        table = self.ragged_seconds.get(rows)
        if table and (num_tokens in table or len(table) >= 2):
            return interpolate(table, num_tokens)
        return self.cost_batch(rows, -(-num_tokens // rows))

    def cost_ragged_curve(self, rows: int, totals: range) -> torch.Tensor:
        """:meth:`cost_ragged` for every token count in ``totals`` at once (the table is sorted once)."""
        table = self.ragged_seconds.get(rows)
        if rows <= 1 or not table or len(table) < 2:
            return torch.tensor([self.cost_ragged(rows, t) for t in totals], dtype=torch.float64)
        keys = torch.tensor(sorted(table), dtype=torch.float64)
        values = torch.tensor([table[int(k)] for k in keys], dtype=torch.float64)
        x = torch.tensor(list(totals), dtype=torch.float64)
        hi = torch.searchsorted(keys, x).clamp(1, len(keys) - 1)  # segment [hi - 1, hi]; the outer ones extend
        lo = hi - 1
        slope = (values[hi] - values[lo]) / (keys[hi] - keys[lo])
        return (values[lo] + slope * (x - keys[lo])).clamp_min(1e-6)

    def cost(self, num_tokens: int) -> float:
        """Estimated seconds (or relative units before any measurement) of a forward with num_tokens new tokens.

        Measured counts answer directly; between two measured counts the cost is interpolated linearly,
        past the largest it grows along the last measured slope (at least the prior's), and below the
        smallest it shrinks by the prior slope.
        """
        if num_tokens in self.seconds:
            return self.seconds[num_tokens]
        if not self.seconds:
            return 1 + self.prior_slope * (num_tokens - 1)
        counts = sorted(self.seconds)
        below = [n for n in counts if n < num_tokens]
        above = [n for n in counts if n > num_tokens]
        if below and above:
            lo, hi = below[-1], above[0]
            w = (num_tokens - lo) / (hi - lo)
            return (1 - w) * self.seconds[lo] + w * self.seconds[hi]
        if below:
            n = below[-1]
            slope = self.seconds[n] * self.prior_slope
            if len(below) >= 2:
                m = below[-2]
                slope = max(slope * 0.25, (self.seconds[n] - self.seconds[m]) / (n - m))
            return self.seconds[n] + slope * (num_tokens - n)
        n = above[0]
        return self.seconds[n] / (1 + self.prior_slope * (n - num_tokens))

    @torch.inference_mode()
    def calibrate_rows(
        self, target, row_counts=(2, 4, 8, 16, 32), context: int = 128, widths: tuple[int, ...] = (1,)
    ) -> dict[tuple[int, int], float]:
        """Time forwards of each number of rows with each width (new tokens per row: 1 is a plain
        decode step, g + 1 a verification of g drafts), each after ``context`` cached tokens.

        Returns {(rows, width): seconds}; every shape goes into ``batch_seconds`` and width 1 into
        ``row_seconds``.
        """
        from .._compat import CACHE_KWARG, engine_attention
        from .kv_cache import RaggedCache

        device = next(target.parameters()).device
        vocab = target.get_input_embeddings().weight.shape[0]
        generator = torch.Generator().manual_seed(0)
        measured = {}
        for rows in row_counts:
            cache = RaggedCache()  # the engine's cache: timings include what its updates cost
            target(
                input_ids=torch.randint(0, vocab, (rows, context), generator=generator).to(device),
                use_cache=True,
                **{CACHE_KWARG: cache},
            )
            for width in widths:
                step = torch.randint(0, vocab, (rows, width), generator=generator).to(device)
                best = float("inf")
                for _ in range(3 if rows * width <= 64 else 2):
                    start = timer(device)
                    with engine_attention(device, width):  # as the engine's forwards attend
                        target(input_ids=step, use_cache=True, **{CACHE_KWARG: cache})
                    best = min(best, timer(device) - start)
                    cache.crop(-width)
                measured[(rows, width)] = self.batch_seconds[(rows, width)] = best
                if width == 1:
                    self.row_seconds[rows] = best
        return measured

    @torch.inference_mode()
    def calibrate(
        self, target, token_counts=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512), context: int = 128, repeats: int = 2
    ) -> dict[int, float]:
        """Time target forwards of each token count after ``context`` cached tokens (start-up profile).

        Rows of a real batch are separate sequences, but the cost of a forward on a CPU or GPU is
        driven by the number of new tokens; one row of n tokens measures it. Returns {count: seconds}.
        """
        from .._compat import CACHE_KWARG, engine_attention
        from .kv_cache import RaggedCache

        device = next(target.parameters()).device
        vocab = target.get_input_embeddings().weight.shape[0]
        generator = torch.Generator().manual_seed(0)
        prefix = torch.randint(0, vocab, (1, context), generator=generator).to(device)
        measured = {}
        for n in token_counts:
            cache = RaggedCache()  # the engine's cache: timings include what its updates cost
            target(input_ids=prefix, use_cache=True, **{CACHE_KWARG: cache})
            ids = torch.randint(0, vocab, (1, n), generator=generator).to(device)
            best = float("inf")
            for _ in range(1 + (repeats if n <= 64 else 1)):  # the first run warms up kernels for this shape
                start = timer(device)
                with engine_attention(device, n):  # as the engine's forwards attend
                    target(input_ids=ids, use_cache=True, **{CACHE_KWARG: cache})
                best = min(best, timer(device) - start)
                cache.crop(-n)
            measured[n] = best
            self.seconds[n] = best
        return measured


def keep_monotone(table: dict[int, float], fresh: int) -> None:
    """Make ``table`` non-decreasing in its key around the entry ``fresh`` just updated (in place): smaller
    keys that cost more are lowered to it, larger keys that cost less are raised to it."""
    value = table[fresh]
    for key, seconds in table.items():
        if (key < fresh and seconds > value) or (key > fresh and seconds < value):
            table[key] = value


def interpolate(table: dict[int, float], key: int) -> float:
    """Linear interpolation in a {count: seconds} table; linear extrapolation along the outer two points."""
    if key in table:
        return table[key]
    counts = sorted(table)
    if len(counts) == 1:
        return table[counts[0]] * key / counts[0]
    lo, hi = (counts[0], counts[1]) if key < counts[0] else (counts[-2], counts[-1])
    for a, b in zip(counts, counts[1:]):
        if a < key < b:
            lo, hi = a, b
            break
    slope = (table[hi] - table[lo]) / (hi - lo)
    return max(table[lo] + slope * (key - lo), 1e-6)
