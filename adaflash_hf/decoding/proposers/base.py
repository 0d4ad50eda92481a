"""The proposer interface: a draft source offers :class:`Candidate` continuations of a row, and a round's
choice among them is a :class:`Proposal`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import torch

if TYPE_CHECKING:
    from .drafter import DrafterBlock


class Candidate(NamedTuple):
    """One continuation a source offers a row: its tokens and each token's acceptance feature."""

    source: str
    tokens: list[int]
    features: list[tuple]


class LookupSource:
    """A draft source that looks continuations up from token history (n-gram indices).

    The batch tells it when a row joins, gains tokens and leaves; each round it offers, per row, up to
    ``branches`` candidates of at most ``max_len`` tokens.
    """

    source: str

    def add_row(self, row, tokens: Sequence[int]) -> None:
        pass

    def extend_row(self, row, tokens: Sequence[int]) -> None:
        pass

    def finish_row(self, row, history: Sequence[int]) -> None:
        pass

    def candidates(self, row, history: Sequence[int], max_len: int, branches: int) -> list[Candidate]:
        raise NotImplementedError


def index_candidates(source: str, index, history: Sequence[int], max_len: int, branches: int) -> list[Candidate]:
    """The continuations of ``history`` that an :class:`~..ngram_index.NGramIndex` (or None) offers."""
    if index is None:
        return []
    return [Candidate(source, *branch) for branch in index.propose_branches(history, max_len, branches)]


@dataclass
class Proposal:
    """The chosen candidate of every row for one round.

    tokens (b, m) long, padded with 0 past each row's ``lengths``; rates (b, m) the estimated
    conditional acceptance of each token (0 past the end); sources the source per row ("none" when a
    row has no candidate, "tree" when its tree merges several sources); features per row, for the
    estimator's update after verification.

    A tree proposal (:mod:`..draft_tree`) also has parents (b, m), each node's parent slot (0: the anchor,
    j + 1: node j), depths (b, m), 1 for a child of the anchor, and node_sources, the source of each node; its
    rates are :func:`~..draft_tree.chain_rates` of the nodes' reach probabilities, so a verify length truncates
    the tree as it truncates a chain.

    candidates: every row's candidates of the round (what the estimator learns from once the target has
    answered); block: the drafter's block when it ran this round; failed: rows whose drafter failed this
    round (they take a plain step).
    """

    tokens: torch.Tensor
    rates: torch.Tensor
    lengths: torch.Tensor
    sources: list[str]
    features: list[list[tuple]]
    parents: torch.Tensor | None = None
    depths: torch.Tensor | None = None
    node_sources: list[list[str]] | None = None
    candidates: list[list[Candidate]] | None = None
    block: DrafterBlock | None = None
    failed: list[int] = field(default_factory=list)
