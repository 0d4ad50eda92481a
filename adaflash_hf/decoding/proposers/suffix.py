"""Suffix matches: continuations of the row's own latest n-gram in its prompt and output so far
(SuffixDecoding / prompt lookup, with counts)."""

from __future__ import annotations

from collections.abc import Sequence

from ..ngram_index import NGramIndex
from .base import Candidate, LookupSource, index_candidates


class SuffixProposer(LookupSource):
    """One :class:`NGramIndex` per row, over its prompt and the tokens it gained."""

    source = "suffix"

    def __init__(self, max_ngram: int):
        self.max_ngram = max_ngram
        self.rows: dict = {}

    def add_row(self, row, tokens: Sequence[int]) -> None:
        index = NGramIndex(self.max_ngram)
        index.start_stream(tokens)
        self.rows[row] = index

    def extend_row(self, row, tokens: Sequence[int]) -> None:
        self.rows[row].extend(tokens)

    def finish_row(self, row, history: Sequence[int]) -> None:
        self.rows.pop(row, None)

    def candidates(self, row, history: Sequence[int], max_len: int, branches: int) -> list[Candidate]:
        return index_candidates(self.source, self.rows.get(row), history, max_len, branches)
