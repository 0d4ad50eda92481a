"""The n-gram continuation index behind every look-up draft source (the row's own text, earlier requests,
the drafter's datastore): :class:`NGramIndex` and the acceptance feature of a look-up token."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence


def ngram_feature(position: int, n: int, count: int, total: int) -> tuple[int, int, int, bool]:
    """A look-up token's acceptance feature: (position capped at 2, n-gram length, count capped at 3, unanimous)."""
    return (min(position, 2), n, min(count, 3), count == total)


class NGramIndex:
    """Counts of the token that follows every n-gram (n = 1..max_n) of the token streams added.

    ``propose`` walks the most frequent continuation of the longest matching n-gram (backing off to
    shorter ones), SuffixDecoding-style. Each proposed token carries the feature ``(position, n,
    count, unanimous)`` (position capped at 2, count at 3) that :class:`AcceptanceEstimator` learns
    acceptance rates for: deeper tokens of a proposal are accepted less often at the same n-gram. With
    ``max_tokens``, the oldest streams are evicted once more tokens than that are indexed.
    """

    def __init__(self, max_n: int = 4, max_tokens: int | None = None):
        self.max_n = max_n
        self.max_tokens = max_tokens
        self.num_tokens = 0
        self._next: dict[tuple[int, ...], dict[int, int]] = {}  # n-gram -> {next token: count}
        self._streams: deque[list[int]] = deque()
        self._tail: list[int] = []  # the newest stream's last max_n tokens: context of the next extend()
        self.source_path: str | None = None  # the datastore file it was loaded from, if any

    def start_stream(self, tokens: Sequence[int] = ()) -> None:
        """Begin a new token stream (n-grams never span two streams)."""
        self._tail = []
        self._streams.append([])
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens to the newest stream, counting each after its preceding 1..max_n tokens."""
        if not self._streams:
            self._streams.append([])
        stream, tail = self._streams[-1], self._tail
        for token in tokens:
            for n in range(1, min(self.max_n, len(tail)) + 1):
                counts = self._next.setdefault(tuple(tail[-n:]), {})
                counts[token] = counts.get(token, 0) + 1
            tail.append(token)
            if len(tail) > self.max_n:
                del tail[0]
        if self.max_tokens is not None:
            stream.extend(tokens)
        self.num_tokens += len(tokens)
        while self.max_tokens is not None and self.num_tokens > self.max_tokens and len(self._streams) > 1:
            self._evict(self._streams.popleft())

    def _evict(self, stream: list[int]) -> None:
        for i, token in enumerate(stream):
            for n in range(1, min(self.max_n, i) + 1):
                key = tuple(stream[i - n : i])
                counts = self._next[key]
                counts[token] -= 1
                if not counts[token]:
                    del counts[token]
                    if not counts:
                        del self._next[key]
        self.num_tokens -= len(stream)

    def propose(self, context: Sequence[int], max_len: int) -> tuple[list[int], list[tuple[int, int, int, bool]]]:
        """The most frequent continuation of ``context`` (up to ``max_len`` tokens) and each token's feature."""
        return self.propose_branches(context, max_len, 1)[0]

    def propose_branches(
        self, context: Sequence[int], max_len: int, branches: int
    ) -> list[tuple[list[int], list[tuple]]]:
        """Up to ``branches`` continuations of ``context``: the most frequent one first, then ones that start
        with the runner-up next tokens of the longest matching n-gram and go on with the most frequent."""
        window = list(context[-self.max_n :])
        n, counts = self._longest_match(window)
        if counts is None or max_len < 1:
            return [([], [])]
        total = sum(counts.values())
        firsts = sorted(counts.items(), key=lambda kv: -kv[1])[:branches]
        out = []
        for rank, (token, count) in enumerate(firsts):
            # a runner-up's first token carries its rank: it is accepted far less often than a top token of equal count
            tokens, features = [token], [ngram_feature(0, n, count, total) + ((rank,) if rank else ())]
            tail = window[1:] + [token] if len(window) >= self.max_n else window + [token]
            more, more_features = self._follow(tail, max_len - 1, start=1)
            out.append((tokens + more, features + more_features))
        return out

    def _longest_match(self, window: list[int]) -> tuple[int, dict[int, int] | None]:
        for n in range(min(self.max_n, len(window)), 0, -1):
            counts = self._next.get(tuple(window[-n:]))
            if counts:
                return n, counts
        return 0, None

    def _follow(self, window: list[int], max_len: int, start: int = 0) -> tuple[list[int], list[tuple]]:
        """The most frequent continuation from ``window``; features count positions from ``start``."""
        window = list(window[-self.max_n :])
        tokens: list[int] = []
        features: list[tuple[int, int, int, bool]] = []
        while len(tokens) < max_len:
            n, counts = self._longest_match(window)
            if counts is None:
                break
            token, count = max(counts.items(), key=lambda kv: kv[1])
            features.append(ngram_feature(start + len(tokens), n, count, sum(counts.values())))
            tokens.append(token)
            window.append(token)
            if len(window) > self.max_n:
                del window[0]
        return tokens, features
