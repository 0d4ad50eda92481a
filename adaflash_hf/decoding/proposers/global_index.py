"""Continuations from earlier requests of this process: the drafting state's bounded global index, which
every finished row's prompt and output join, so structure that repeats across requests is reused."""

from __future__ import annotations

from collections.abc import Sequence

from ..drafting_state import DraftingState
from .base import Candidate, LookupSource, index_candidates


class GlobalIndexProposer(LookupSource):
    source = "global"

    def __init__(self, state: DraftingState):
        self.state = state  # its index is replaced when the state forgets requests: read it each round

    def finish_row(self, row, history: Sequence[int]) -> None:
        self.state.remember(history)

    def candidates(self, row, history: Sequence[int], max_len: int, branches: int) -> list[Candidate]:
        index = self.state.global_index
        return index_candidates(self.source, index if index.num_tokens else None, history, max_len, branches)
