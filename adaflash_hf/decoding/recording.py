"""What the engine hands to on-line learning: a round observer, called only when one is attached.

``decoding/`` never imports ``online/``: the engine calls an object that follows
:class:`RoundObserver` (``online.trajectories.TrajectoryRecorder`` and the OPD pipeline's hook are
two). With no observer attached the engine does no extra work. Every tensor handed out is a view of
what verification computed anyway, so recording costs no extra target pass; an observer that keeps
one must copy it.

Position conventions (one row): the target has processed tokens ``x[0..n)``; ``features[t]`` is its
context features after token t; ``logits[t]`` is its distribution for token t + 1.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Protocol

import torch


class RoundObserver(Protocol):
    def before_round(self) -> None:
        """Called on the engine thread before every round: the only place weights may change."""

    def on_prefill(
        self,
        row_id: Hashable,
        prompt_ids: Sequence[int],
        features: torch.Tensor | None,
        logits: torch.Tensor,
        first_token: int,
    ) -> None:
        """A row joined. features (P, F) of its prompt tokens (None without a drafter); logits (V,) of the
        last one, the distribution behind ``first_token``."""

    def on_round(
        self,
        row_id: Hashable,
        features: torch.Tensor | None,
        logits: torch.Tensor,
        tokens: Sequence[int],
        num_drafts: int,
        source: str,
    ) -> None:
        """A row's round: the target processed n = len(tokens) more inputs (its newest token, then the
        accepted drafts); features (n, F) and logits (n, V) belong to those inputs and ``tokens`` are the
        n tokens that follow them (accepted drafts, then the target's own token). ``num_drafts`` were
        verified, so ``num_drafts > n - 1`` means draft n was rejected. ``source`` is where the drafts came from.
        """

    def on_finish(self, row_id: Hashable) -> None:
        """The row left the batch (finished or cancelled)."""
