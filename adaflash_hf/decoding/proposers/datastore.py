"""Continuations from the target's own responses to training prompts, shipped with the drafter
(``datastore.safetensors``, a REST-style datastore; read by :func:`~..datastore_file.load_datastore`)."""

from __future__ import annotations

from collections.abc import Sequence

from ..ngram_index import NGramIndex
from .base import Candidate, LookupSource, index_candidates


class DatastoreProposer(LookupSource):
    source = "datastore"

    def __init__(self, index: NGramIndex):
        self.index = index

    def candidates(self, row, history: Sequence[int], max_len: int, branches: int) -> list[Candidate]:
        return index_candidates(self.source, self.index, history, max_len, branches)
