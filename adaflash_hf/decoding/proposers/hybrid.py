"""The per-row merge of every draft source's candidates into one round's :class:`~.base.Proposal`.

Verification does not care where a candidate continuation came from, so each round every row merges its
candidates into a draft tree (:mod:`..draft_tree`; or, with ``tree_nodes=0`` and behind
``generate(assistant_model=)``, takes the most promising one) from the drafter's block
(:mod:`.drafter`), suffix matches (:mod:`.suffix`), earlier requests (:mod:`.global_index`) and the
drafter's datastore (:mod:`.datastore`); or a row gets nothing (a plain step), when no candidate is
expected to pay for a longer verification.

"Most promising" is measured, not assumed: the expected accepted length of a candidate comes from the
:class:`~..acceptance.AcceptanceEstimator`'s rates for its tokens' features. How many tokens to verify is
the verify-length policy's decision (:mod:`..policy`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from ..acceptance import expected_accepted
from ..config import NONE, TREE, DraftingConfig
from ..draft_tree import build_tree, chain_rates
from ..drafting_state import DraftingState
from ..ngram_index import NGramIndex
from .base import Candidate, LookupSource, Proposal
from .datastore import DatastoreProposer
from .drafter import DrafterBlock, DrafterProposer, drafter_bucket
from .global_index import GlobalIndexProposer
from .suffix import SuffixProposer


class HybridProposer:
    """Builds each round's :class:`Proposal` from the drafter block and the look-up sources of the rows."""

    def __init__(
        self,
        state: DraftingState,
        config: DraftingConfig,
        drafter: DrafterProposer | None = None,
        datastore: NGramIndex | None = None,
    ):
        """drafter: the batch's drafter (None: no drafter runs); datastore: the drafter's, if it ships one."""
        self.state, self.config, self.drafter = state, config, drafter
        self.lookups: list[LookupSource] = []  # in the order their candidates are listed
        suffix = SuffixProposer(config.max_ngram) if config.suffix else None
        self.rows = {} if suffix is None else suffix.rows  # per-row suffix indices, freed when rows finish
        if suffix is not None:
            self.lookups.append(suffix)
        if config.global_index:
            self.lookups.append(GlobalIndexProposer(state))
        if datastore is not None and config.datastore:
            self.lookups.append(DatastoreProposer(datastore))
        block_size = None if drafter is None else drafter.block_size
        if block_size is None and not self.lookups:
            raise ValueError(
                "no draft source is left: pass a drafter, or enable suffix, global_index or a datastore in "
                "DraftingConfig."
            )
        self.max_len = max((block_size or 1) - 1, config.max_suffix_tokens if self.lookups else 0)  # longest proposal
        # a tree needs two candidates to merge: a lone drafter block stays a chain
        self.trees = config.tree_nodes > 0 and len(self.lookups) * config.branches + int(block_size is not None) > 1
        self.history: dict[Hashable, list[int]] = {}

    def add_row(self, row: Hashable, tokens: Sequence[int]) -> None:
        self.history[row] = list(tokens)
        for lookup in self.lookups:
            lookup.add_row(row, tokens)

    def extend_row(self, row: Hashable, tokens: Sequence[int]) -> None:
        self.history[row].extend(tokens)
        for lookup in self.lookups:
            lookup.extend_row(row, tokens)

    def finish_row(self, row: Hashable) -> None:
        history = self.history.pop(row)
        for lookup in self.lookups:
            lookup.finish_row(row, history)

    def propose(
        self,
        row_ids: list,
        anchors: torch.Tensor | None = None,
        anchor_pos: torch.Tensor | None = None,
        tree: bool = False,
        max_depths: Sequence[int] | None = None,
        max_len: int | None = None,
    ) -> Proposal:
        """Choose, per row, the candidate with the most expected accepted drafts, or (``tree``) merge them.

        The drafter drafts a block after every row's anchor (b,) at anchor_pos (b,) when its expected extra
        accepted tokens pay for its measured cost (:meth:`DraftingState.drafter_pays`) or, with
        ``DraftingConfig.drafter_scores``, when its pass is cheap (:meth:`DraftingState.drafter_is_cheap`); then its
        probability of every look-up token joins that token's feature. Otherwise the round skips it and its
        context waits for the next round that runs it.

        With ``tree``, every candidate (each index also offers ``DraftingConfig.branches`` continuations)
        goes into one draft tree per row of at most ``DraftingConfig.tree_nodes`` nodes and
        ``max_depths[i]`` levels (:func:`~..draft_tree.build_tree`), for an engine that verifies trees.

        ``max_len``: the most drafts a row can verify this round (:func:`~..policy.verify_limit`); look-ups
        follow their matches no further, and the draft head scores no more block positions.
        """
        limit = self.max_len if max_len is None else max(0, min(self.max_len, max_len))
        branches = self.config.branches if tree else 1
        reach = min(self.config.max_suffix_tokens, limit)
        candidates = [
            [c for lookup in self.lookups for c in lookup.candidates(row, self.history[row], reach, branches)]
            for row in row_ids
        ]
        block = self._maybe_draft(row_ids, candidates, anchors, anchor_pos, limit, max_len)
        if tree:
            proposal = self._tree_proposal(candidates, max_depths or [limit] * len(row_ids), limit)
        else:
            proposal = self._chain_proposal(candidates, limit)
        proposal.candidates, proposal.block, proposal.failed = candidates, block, [] if block is None else block.failed
        return proposal

    def _maybe_draft(
        self, row_ids, candidates: list[list[Candidate]], anchors, anchor_pos, limit: int, max_len: int | None
    ) -> DrafterBlock | None:
        """Run the drafter where it pays or scores the look-ups; its block joins each row's candidates first."""
        if self.drafter is None:
            return None
        best_other = [max((self._value(c, limit)[0] for c in options), default=0.0) for options in candidates]
        pays = self.config.drafter_every_round or self.state.drafter_pays(best_other, limit + 1)
        scores = self.config.drafter_scores and self.state.drafter_is_cheap(len(row_ids))
        if not (pays or scores):
            return None
        block = self.drafter.propose(row_ids, anchors, anchor_pos, max_len)
        if scores and block.scorer is not None:  # the drafter's opinion of every look-up token joins its feature
            probs = iter(block.scorer([(i, c.tokens) for i, options in enumerate(candidates) for c in options]))
            for options in candidates:
                options[:] = [
                    Candidate(c.source, c.tokens, [f + (drafter_bucket(q),) for f, q in zip(c.features, next(probs))])
                    for c in options
                ]
        for options, drafted in zip(candidates, block.candidates(limit)):
            if drafted is None:  # the drafter failed this row: it takes a plain step
                options.clear()
            else:
                options.insert(0, drafted)
        return block

    def _chain_proposal(self, candidates: list[list[Candidate]], limit: int) -> Proposal:
        chosen: list[tuple[str, list[int], list[tuple], list[float]]] = []
        for options in candidates:
            best, best_value = (NONE, [], [], []), 0.0
            for option in options:
                value, rates = self._value(option, limit)
                if value > best_value:
                    best, best_value = (option.source, option.tokens[:limit], option.features[:limit], rates), value
            chosen.append(best)
        width = max((len(c[1]) for c in chosen), default=0)
        tokens = torch.zeros(len(candidates), width, dtype=torch.long)
        rates = torch.zeros(len(candidates), width)
        for i, (_, toks, _, row_rates) in enumerate(chosen):
            tokens[i, : len(toks)] = torch.tensor(toks, dtype=torch.long)
            rates[i, : len(row_rates)] = torch.tensor(row_rates)
        lengths = torch.tensor([len(c[1]) for c in chosen], dtype=torch.long)
        return Proposal(tokens, rates, lengths, [c[0] for c in chosen], [c[2] for c in chosen])

    def _tree_proposal(self, candidates: list[list[Candidate]], max_depths: Sequence[int], limit: int) -> Proposal:
        trees, node_sources = [], []
        for options, depth in zip(candidates, max_depths):
            row_tree = build_tree(
                [(c.tokens, self._value(c, limit)[1]) for c in options], self.config.tree_nodes, min(depth, limit)
            )
            trees.append(row_tree)
            node_sources.append([options[o].source for o in row_tree.origins])
        width = max((len(t) for t in trees), default=0)
        b = len(trees)
        tokens, parents, depths = (
            torch.zeros(b, width, dtype=torch.long) for _ in range(3)
        )  # padding: children of the anchor
        depths[:] = 1
        rates = torch.zeros(b, width)
        for i, row_tree in enumerate(trees):
            n = len(row_tree)
            tokens[i, :n] = torch.tensor(row_tree.tokens, dtype=torch.long)
            parents[i, :n] = torch.tensor(row_tree.parents, dtype=torch.long)
            depths[i, :n] = torch.tensor(row_tree.depths, dtype=torch.long)
            rates[i, :n] = torch.tensor(chain_rates(row_tree.probs))
        lengths = torch.tensor([len(t) for t in trees], dtype=torch.long)
        sources = [NONE if not ns else ns[0] if len(set(ns)) == 1 else TREE for ns in node_sources]
        return Proposal(
            tokens,
            rates,
            lengths,
            sources,
            [[] for _ in trees],
            parents=parents,
            depths=depths,
            node_sources=node_sources,
        )

    def no_proposal(self, row_ids: list) -> Proposal:
        """An empty proposal (every row takes a plain step), made without looking anything up."""
        b = len(row_ids)
        return Proposal(
            torch.zeros(b, 0, dtype=torch.long),
            torch.zeros(b, 0),
            torch.zeros(b, dtype=torch.long),
            [NONE] * b,
            [[] for _ in row_ids],
            candidates=[[] for _ in row_ids],
        )

    def _value(self, option: Candidate, limit: int) -> tuple[float, list[float]]:
        rates = [self.state.estimator.rate(option.source, f) for f in option.features[:limit]]
        return expected_accepted(rates), rates
