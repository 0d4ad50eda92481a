"""Per-row calibration of acceptance estimates: rows whose drafts are rarely accepted fall back to plain first.

The acceptance estimator (:mod:`.acceptance`) rates a draft by features shared across requests (the n-gram
behind a look-up, the drafter's position and confidence), so every row of a batch gets the same rate for the same
kind of draft. Requests differ: on some the target keeps leaving the drafts' path. :class:`RowTrust` keeps, per
row, how many drafts it got accepted against how many the estimates promised for the drafts it verified, and
scales each row's estimated expected tokens by that ratio (at most 1, with a prior worth ``prior_weight``
expected tokens), by scaling the rate of its first draft: every term of the expected accepted length
sum_k prod_{j<=k} a_j carries a_1, so the row's whole expectation scales with it. The verify-length choice then
drops the drafts of such rows first, and in a batch their rows take plain steps while better rows keep drafting.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

import torch


class RowTrust:
    """Realised over expected accepted drafts per row, decayed per verified round, bounded in memory.

    Args:
        prior_weight: expected tokens of pseudo-evidence at ratio 1, so a row starts trusted and one unlucky round
            moves it little.
        decay: per verified round of the row, so a request that changes character (code, then prose) is judged
            by its last few dozen rounds.
        max_rows: rows remembered (least recently updated forgotten first); the batch forgets a row when it leaves.
    """

    def __init__(self, prior_weight: float = 2.0, decay: float = 0.95, max_rows: int = 1024):
        if prior_weight <= 0 or not 0 < decay <= 1 or max_rows < 1:
            raise ValueError(
                f"prior_weight={prior_weight}, decay={decay}, max_rows={max_rows}: need prior_weight > 0, "
                "0 < decay <= 1 and max_rows >= 1."
            )
        self.prior_weight, self.decay, self.max_rows = prior_weight, decay, max_rows
        self.sums: OrderedDict[Hashable, list[float]] = OrderedDict()  # row -> [accepted, expected]

    def trust(self, row: Hashable) -> float:
        """The row's factor in (0, 1]: (accepted + w) / (expected + w), at most 1."""
        accepted, expected = self.sums.get(row, (0.0, 0.0))
        return min(1.0, (accepted + self.prior_weight) / (expected + self.prior_weight))

    def scale(self, rows: Sequence[Hashable], rates: torch.Tensor) -> torch.Tensor:
        """rates (b, m) conditional acceptance rates of the rows' proposals -> the same with each row's first rate
        times its trust (a new tensor; ``rates`` is unchanged)."""
        factors = torch.tensor([self.trust(row) for row in rows], dtype=rates.dtype, device=rates.device)
        if rates.shape[1] == 0 or bool((factors == 1).all()):
            return rates
        scaled = rates.clone()
        scaled[:, 0] *= factors
        return scaled

    def update(
        self, rows: Sequence[Hashable], rates: torch.Tensor, num_drafts: Sequence[int], accepted: Sequence[int]
    ) -> None:
        """File a verified round: ``rates`` (b, m) the estimates before scaling, ``num_drafts[i]`` drafts row i
        verified along its chain (or its tree's accepted path), ``accepted[i]`` of them accepted. Rows that verified
        no draft are left as they were."""
        gains = rates.float().clamp(0, 1).cumprod(-1).cpu()  # (b, m): probability that drafts 1..k all pass
        for i, (row, n, a) in enumerate(zip(rows, num_drafts, accepted)):
            n = min(int(n), gains.shape[1])
            if n <= 0:
                continue
            expected = float(gains[i, :n].sum())
            old = self.sums.pop(row, [0.0, 0.0])
            self.sums[row] = [self.decay * old[0] + int(a), self.decay * old[1] + expected]
        while len(self.sums) > self.max_rows:
            self.sums.popitem(last=False)

    def forget(self, rows: Sequence[Hashable]) -> None:
        for row in rows:
            self.sums.pop(row, None)


class RowPace:
    """Tokens each row is ahead of plain decoding: the sum over its rounds of the tokens it gained minus the plain
    steps the round's time was worth (a plain step gains each row one token), bounded in memory like
    :class:`RowTrust`. The row slowdown bound lets a row spend what it is ahead (:func:`~.goodput.within_slowdown`)."""

    def __init__(self, max_rows: int = 1024):
        if max_rows < 1:
            raise ValueError(f"max_rows={max_rows}: need max_rows >= 1.")
        self.max_rows = max_rows
        self.ahead: OrderedDict[Hashable, float] = OrderedDict()

    def update(self, rows: Sequence[Hashable], tokens: Sequence[float], steps: float) -> None:
        """File a round: row ``rows[i]`` gained ``tokens[i]`` in ``steps`` plain steps' time."""
        for row, gained in zip(rows, tokens):
            self.ahead[row] = self.ahead.pop(row, 0.0) + float(gained) - steps
        while len(self.ahead) > self.max_rows:
            self.ahead.popitem(last=False)

    def slack(self, rows: Sequence[Hashable]) -> torch.Tensor:
        """(b,) tokens each row is ahead, 0 for rows behind or not seen."""
        return torch.tensor([max(0.0, self.ahead.get(row, 0.0)) for row in rows], dtype=torch.float32)
