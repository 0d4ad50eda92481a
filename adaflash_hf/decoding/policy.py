"""Verify-length policies: how many tokens the target verifies per row in each round.

``verify_len`` counts the anchor (last accepted token) plus the drafts checked, so a policy
returns values in [1, block_size] and a row verifies ``verify_len - 1`` drafts. The engine runs
one target forward over the longest row's verify length and caps each row's acceptance at its own.

A policy sees the drafter's hidden states for the block (the adaptive length head reads them) and
is told what each round cost and accepted, so it can adapt to the load.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


class VerifyLengthPolicy(Protocol):
    def verify_lens(self, draft_hidden_states: torch.Tensor, block_size: int) -> torch.Tensor:
        """draft_hidden_states (b, block_size, H) -> verify_len (b,) long, each in [1, block_size]."""

    def update(self, accept_lengths: torch.Tensor, verify_lens: torch.Tensor, verify_time: float) -> None:
        """Feedback after verification: accepted drafts (b,), verify lengths (b,), seconds spent."""


@dataclass
class FixedVerifyLength:
    """Verify a fixed number of tokens (default: the whole block)."""

    verify_len: int | None = None

    def __post_init__(self):
        if self.verify_len is not None and self.verify_len < 1:
            raise ValueError(f"verify_len={self.verify_len}: must be >= 1 (the anchor plus any drafts).")

    def verify_lens(self, draft_hidden_states: torch.Tensor, block_size: int) -> torch.Tensor:
        length = block_size if self.verify_len is None else min(self.verify_len, block_size)
        return torch.full((draft_hidden_states.shape[0],), length, dtype=torch.long, device=draft_hidden_states.device)

    def update(self, accept_lengths: torch.Tensor, verify_lens: torch.Tensor, verify_time: float) -> None:
        pass
