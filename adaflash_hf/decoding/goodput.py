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


def within_slowdown(
    lengths: torch.Tensor,
    rates: torch.Tensor,
    cost_model: VerifyCostModel,
    max_slowdown: float,
    overhead: float = 0.0,
    ragged: bool = True,
    slack: torch.Tensor | None = None,
) -> torch.Tensor:
    """Trim a batch's verify lengths so that no row's expected time per token exceeds a plain step's by more than
    ``max_slowdown``.

    In a batched round every row waits for the whole round, so a row that gains ``E_i`` expected tokens from a
    round costing ``c`` decodes at ``c / E_i`` per token, against a plain step's ``c_0`` without speculation. The
    least-served row (smallest ``E_i``) sets the bound: ``(overhead + c) / c_0 <= max_slowdown * min_i E_i``, with
    ``c`` the verify forward's estimated cost (ragged: by total tokens; else rows times the longest length),
    ``c_0`` that of one token per row (a plain step) and ``overhead`` what the round already spent proposing
    (the drafter's pass). lengths (b,) in [1, m + 1], rates (b, m) conditional acceptance rates -> (b,) lengths:
    the chosen drafts are dropped least likely first, keeping the most of them that meet the bound; where none
    does (the proposal alone cost more than the bound allows), the ones whose round comes closest to it.

    ``slack`` (b,), optional: tokens each row is ahead of where plain steps would have brought it in the same time
    (negative entries count as 0). A row may spend them: its bound becomes ``(overhead + c) / c_0 <= max_slowdown *
    E_i + slack_i``, so a request that earlier rounds served well does not hold back the batch, and only rows at
    plain pace, whose latency a slower round would lengthen, set the bound.
    """
    b, m = rates.shape
    drafts = (lengths.cpu() - 1).clamp(0, m)
    if b < 2 or m == 0 or int(drafts.sum()) == 0:
        return lengths
    gains = rates.float().cpu().clamp(0, 1).cumprod(-1)  # (b, m): expected tokens each draft adds
    chosen = torch.arange(m)[None, :] < drafts[:, None]  # each row's drafts are a prefix
    row_of, position = chosen.nonzero(as_tuple=True)  # row-major, positions ascending within a row
    values, order = gains[row_of, position].sort(descending=True, stable=True)  # a row's drafts stay in order
    row_of = row_of[order]
    n = len(order)
    added = torch.zeros(n, b)
    added[torch.arange(n), row_of] = values
    expected = 1 + torch.cat([torch.zeros(1, b), added.cumsum(0)])  # (n + 1, b): E_i with the first j drafts
    if ragged:
        costs = cost_model.cost_ragged_curve(b, range(b, b + n + 1)).float()
    else:
        counts = torch.cat([torch.zeros(1, b), torch.nn.functional.one_hot(row_of, b).float().cumsum(0)])
        widths = (counts.max(1).values + 1).long().tolist()  # rectangular: every row as long as the longest
        costs = torch.tensor([cost_model.cost_batch(b, w) for w in widths], dtype=torch.float32)
    if slack is not None:  # (overhead + c) / c_0 <= s * (E_i + slack_i / s)
        expected = expected + slack.float().cpu().clamp_min(0)[None, :] / max_slowdown
    slowdown = (overhead + costs) / costs[0] / expected.min(1).values  # (n + 1,)
    feasible = (slowdown <= max_slowdown).nonzero().flatten()
    keep = int(feasible.max()) if len(feasible) else int(slowdown.argmin())
    return 1 + torch.bincount(row_of[:keep], minlength=b).to(lengths.dtype)
