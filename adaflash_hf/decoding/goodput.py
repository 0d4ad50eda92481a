"""The goodput choice of verify lengths: how many drafts maximise the batch's expected tokens per second, from
the drafts' estimated acceptance rates and the measured cost of a verify forward (:mod:`.cost`)."""

from __future__ import annotations

import torch

from .cost import VerifyCostModel


def goodput_verify_len(rates: torch.Tensor, cost_model: VerifyCostModel, max_verify_len: int | None = None) -> int:
    """The verify length g + 1 that maximises the batch's expected tokens per second.

    rates (b, m) conditional acceptance rates. Expected tokens of the batch when every row verifies
    g drafts: sum over rows of 1 + sum_{k<=g} prod_{j<=k} a_j (DESIGN §2); cost: one forward over
    b * (g + 1) new tokens. The forward is rectangular, so one g serves the whole batch.
    """
    b, m = rates.shape
    if max_verify_len is not None:
        m = min(m, max_verify_len - 1)
    expected = torch.cat(
        [torch.zeros(b, 1), rates[:, :m].float().cpu().cumprod(-1).cumsum(-1)], dim=1
    )  # (b, m + 1): E[g]
    tokens = (1 + expected).sum(0)  # (m + 1,) expected tokens of the batch for g = 0..m
    costs = torch.tensor([cost_model.cost_batch(b, g + 1) for g in range(m + 1)])
    return int((tokens / costs).argmax()) + 1


MIN_GAIN = 0.02  # a draft less likely than this to be accepted never pays for its verification


def ragged_verify_lens(
    rates: torch.Tensor, cost_model: VerifyCostModel, max_verify_len: int | None = None
) -> torch.Tensor:
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
