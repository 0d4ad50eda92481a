"""Verify-length policies: how many tokens the target verifies per row in each round.

``verify_len`` counts the anchor (last accepted token) plus the drafts checked, so a policy returns
values in [1, m + 1] for a proposal of m drafts, and a row verifies ``verify_len - 1`` drafts (1 is a
plain decode step). The engine runs one target forward over the longest row's verify length and caps
each row's acceptance at its own.

A policy sees the estimated conditional acceptance of every proposed draft and the drafter's hidden
states for the block (the adaptive length head reads them), and is told what each round cost and
accepted, so it can adapt to the machine and the load.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from .cost import VerifyCostModel


class VerifyLengthPolicy(Protocol):
    def verify_lens(self, rates: torch.Tensor, draft_hidden_states: torch.Tensor | None) -> torch.Tensor:
        """rates (b, m) estimated P(accept draft k | drafts < k accepted), 0 past a row's proposal;
        draft_hidden_states (b, B, H) or None when no drafter ran -> verify_len (b,) long in [1, m + 1]."""

    def update(self, accept_lengths: torch.Tensor, verify_lens: torch.Tensor, verify_time: float) -> None:
        """Feedback after verification: accepted drafts (b,), verify lengths (b,), seconds spent."""


@dataclass
class FixedVerifyLength:
    """Verify a fixed number of tokens per row (default: the whole proposal)."""

    verify_len: int | None = None

    def __post_init__(self):
        if self.verify_len is not None and self.verify_len < 1:
            raise ValueError(f"verify_len={self.verify_len}: must be >= 1 (the anchor plus any drafts).")

    def verify_lens(self, rates: torch.Tensor, draft_hidden_states: torch.Tensor | None) -> torch.Tensor:
        length = rates.shape[1] + 1 if self.verify_len is None else min(self.verify_len, rates.shape[1] + 1)
        return torch.full((rates.shape[0],), length, dtype=torch.long)

    def update(self, accept_lengths: torch.Tensor, verify_lens: torch.Tensor, verify_time: float) -> None:
        pass


@dataclass
class GoodputVerifyLength:
    """Maximise expected tokens per second: sum over rows of (1 + E[accepted | g drafts]) / cost(b * (g + 1)).

    E comes from the proposal's estimated acceptance rates; cost from a :class:`VerifyCostModel`, measured
    on this machine as rounds run (the engine binds the drafting state's model when none is given). g = 0
    (a plain step) wins when no draft is likely enough to pay for a longer forward. The forward is
    rectangular, so one g serves the whole batch.
    """

    max_verify_len: int | None = None
    cost_model: VerifyCostModel | None = None

    def verify_lens(self, rates: torch.Tensor, draft_hidden_states: torch.Tensor | None) -> torch.Tensor:
        b, m = rates.shape
        if self.max_verify_len is not None:
            m = min(m, self.max_verify_len - 1)
        expected = torch.cat([torch.zeros(b, 1), rates[:, :m].float().cumprod(-1).cumsum(-1)], dim=1)  # (b, m + 1): E[g]
        tokens = (1 + expected).sum(0)  # (m + 1,) expected tokens of the batch for g = 0..m
        cost_model = self.cost_model or VerifyCostModel()
        costs = torch.tensor([cost_model.cost(b * (g + 1)) for g in range(m + 1)])
        g = int((tokens / costs).argmax())
        return torch.full((b,), g + 1, dtype=torch.long)

    def update(self, accept_lengths: torch.Tensor, verify_lens: torch.Tensor, verify_time: float) -> None:
        pass  # the engine feeds the cost model
