"""Cutting text into pieces: passages of a word range at sentence ends, and evenly spread picks of a list."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+|(?<=[.!?][\"'\u201d\u2019)\]])\s+")


def split_passages(text: str, min_words: int, max_words: int) -> list[str]:
    """Consecutive passages of ``min_words``–``max_words`` words, cut at sentence ends.

    Paragraph breaks (blank lines) inside a passage are kept. A sentence longer than ``max_words``
    is cut by words. A final passage shorter than ``min_words // 2`` words is dropped unless it is
    the only one.
    """
    if not 0 < min_words <= max_words:
        raise ValueError(f"Need 0 < min_words <= max_words, got min_words={min_words}, max_words={max_words}.")
    passages: list[str] = []
    current: list[str] = []  # sentences, with "\n\n" entries for paragraph breaks
    count = 0

    def flush() -> None:
        nonlocal count
        while current and current[-1] == "\n\n":
            current.pop()
        if current:
            passages.append(" ".join(current).replace(" \n\n ", "\n\n"))
        current.clear()
        count = 0

    for paragraph in re.split(r"\n\s*\n", text):
        if current:
            current.append("\n\n")
        for sentence in SENTENCE_BREAK.split(paragraph.strip()):
            words = sentence.split()
            for start in range(0, len(words), max_words):
                piece = words[start : start + max_words]
                if count and count + len(piece) > max_words:
                    flush()
                current.append(" ".join(piece))
                count += len(piece)
                if count >= min_words:
                    flush()
    tail_words = count
    flush()
    if len(passages) > 1 and tail_words and tail_words < min_words // 2:
        passages.pop()
    return [p for p in passages if p.strip()]


def spread_evenly(items: Sequence[Any], k: int) -> list[Any]:
    """At most ``k`` items, evenly spaced over ``items`` (all of them when ``len(items) <= k``)."""
    if len(items) <= k:
        return list(items)
    return [items[(i * len(items)) // k] for i in range(k)]
