"""Draft trees: several candidate continuations of a row verified in one target forward.

A row often has several candidates that disagree: the drafter's block, the most frequent suffix
continuation, the runner-up continuation, the datastore's. Verifying only the best one throws the
others away, although on a CPU (and a GPU) a forward over 16 new tokens costs little more than one
over 4. Merged into a trie, they share their common prefixes, and the target checks every branch at
once (SpecInfer, Medusa, SuffixDecoding's speculation trees): each node attends to the cache and to
its own ancestors only (a 4-D mask), at position ``anchor + depth``.

Acceptance walks the trie from the anchor: at each node take the target's token (its argmax, or a
sample from its distribution) and descend into the child holding that token, if there is one. Every
emitted token is the target's own choice given the accepted prefix, so the walk is exactly lossless
for greedy decoding and for sampling alike (a point-mass draft per child, DESIGN §2).

Nodes are kept best first by their estimated probability of being reached, so any prefix of a
tree's node list is a tree (parents come before their children), and a verify length chosen by
:mod:`.policy` from the "rates" :func:`chain_rates` makes of those probabilities truncates it.

Shapes: ``b`` rows, ``m`` nodes per row (padded), node ``j`` is slot ``j + 1`` of the verify input
(slot 0 is the anchor); ``parents`` hold slot indices, 0 for a child of the anchor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .sampling import SamplingParams, logits_to_probs, sample


@dataclass
class DraftTree:
    """One row's draft tree, best node first; a node's parent always comes before it.

    tokens: node tokens; parents: the parent's slot (0: the anchor, j + 1: node j); depths: 1 for a
    child of the anchor; probs: the estimated probability that verification reaches the node; origins:
    the index of the candidate that gives the node its probability.
    """

    tokens: list[int]
    parents: list[int]
    depths: list[int]
    probs: list[float]
    origins: list[int]

    def __len__(self) -> int:
        return len(self.tokens)


def build_tree(
    candidates: Sequence[tuple[Sequence[int], Sequence[float]]], max_nodes: int, max_depth: int
) -> DraftTree:
    """Merge candidate continuations into a trie and keep its ``max_nodes`` most likely nodes.

    candidates: (tokens, rates) pairs, rates[k] the estimated P(token k accepted | tokens < k accepted).
    A node's probability of being reached is the best product of rates along a candidate through it;
    the target picks one token per node, so children's probabilities are scaled to sum to at most
    their parent's. Nodes below ``max_depth`` and nodes that cannot be reached are dropped.
    """
    # 1. the trie: (parent node or -1, token) -> node; each node's best reach probability and origin
    index: dict[tuple[int, int], int] = {}
    tokens: list[int] = []
    parents: list[int] = []  # node index, -1 for the anchor
    probs: list[float] = []
    origins: list[int] = []
    for c, (chain, rates) in enumerate(candidates):
        parent, reach = -1, 1.0
        for token, rate in zip(chain[:max_depth], rates):
            reach *= float(rate)
            if reach <= 0.0:
                break
            node = index.get((parent, token))
            if node is None:
                node = index[(parent, token)] = len(tokens)
                tokens.append(token)
                parents.append(parent)
                probs.append(reach)
                origins.append(c)
            elif reach > probs[node]:
                probs[node], origins[node] = reach, c
            parent = node
    # 2. siblings are exclusive events: scale each node's children (and their subtrees) to fit under it
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(parents):
        children.setdefault(parent, []).append(node)
    for parent in [-1, *range(len(tokens))]:  # parents are created before children: top-down
        kids = children.get(parent, [])
        budget = probs[parent] if parent >= 0 else 1.0
        total = sum(probs[k] for k in kids)
        if total > budget > 0:
            factor = budget / total
            stack = list(kids)
            while stack:  # the whole subtree shrinks with its root
                n = stack.pop()
                probs[n] *= factor
                stack.extend(children.get(n, []))
    # 3. best first (ties: shallower first, so a parent precedes a child of equal probability)
    depths = [0] * len(tokens)
    for node, parent in enumerate(parents):
        depths[node] = 1 + (depths[parent] if parent >= 0 else 0)
    order = sorted(range(len(tokens)), key=lambda n: (-probs[n], depths[n], n))[:max_nodes]
    slot = {node: j + 1 for j, node in enumerate(order)}
    return DraftTree(
        tokens=[tokens[n] for n in order],
        parents=[slot[parents[n]] if parents[n] >= 0 else 0 for n in order],
        depths=[depths[n] for n in order],
        probs=[probs[n] for n in order],
        origins=[origins[n] for n in order],
    )


def chain_rates(probs: Sequence[float]) -> list[float]:
    """Reach probabilities r_1 >= r_2 >= ... as the "conditional rates" a_k = r_k / r_{k-1} of a chain.

    The verify-length policy values a prefix of k drafts at sum_{j<=k} prod_{i<=j} a_i (DESIGN §2), which
    for these rates is r_1 + ... + r_k: the expected accepted tokens of the tree's first k nodes.
    """
    rates, previous = [], 1.0
    for p in probs:
        rates.append(p / previous if previous > 0 else 0.0)
        previous = p
    return rates


def is_chain(parents: torch.Tensor, num_drafts: torch.Tensor) -> bool:
    """Whether every row's verified nodes form a single chain (node j's parent is slot j)."""
    m = parents.shape[1]
    chain = torch.arange(m, device=parents.device)[None]
    verified = chain < num_drafts.to(parents.device)[:, None]
    return bool(((parents == chain) | ~verified).all())


def ancestor_mask(parents: torch.Tensor) -> torch.Tensor:
    """(b, m) parent slots -> (b, m + 1, m + 1) bool: slot q may attend to slot k (k is q or an ancestor of q)."""
    b, m = parents.shape
    mask = torch.eye(m + 1, dtype=torch.bool, device=parents.device).expand(b, -1, -1).clone()
    rows = torch.arange(b, device=parents.device)
    for j in range(m):  # a parent's row is complete before its children's (parents come first)
        mask[:, j + 1] |= mask[rows, parents[:, j]]
    return mask


def tree_attention_mask(slot_mask: torch.Tensor, parents: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The additive 4-D mask of a tree verification: (b, 1, m + 1, S + m + 1), 0 where attention is allowed.

    slot_mask (b, S) 1 where a cache slot holds an accepted token; parents (b, m) parent slots.
    """
    b, m = parents.shape
    allowed = torch.cat([slot_mask.bool()[:, None, :].expand(b, m + 1, -1), ancestor_mask(parents)], dim=2)
    bias = torch.zeros(allowed.shape, dtype=dtype, device=slot_mask.device)
    return bias.masked_fill(~allowed, torch.finfo(dtype).min)[:, None]


def tree_accept(
    draft_tokens: torch.Tensor,
    parents: torch.Tensor,
    target_logits: torch.Tensor,
    num_drafts: torch.Tensor,
    params: Sequence[SamplingParams],
    generator: torch.Generator | None = None,
) -> tuple[list[list[int]], torch.Tensor]:
    """Walk each row's tree from the anchor with the target's own choices.

    draft_tokens (b, m) and parents (b, m) of the nodes; target_logits (b, m + 1, V), slot q predicting
    the token after slot q; num_drafts (b,) nodes each row verifies (a prefix of its list). A greedy row
    follows the argmax; a sampling row samples from its processed distribution at each node it reaches.
    Returns the accepted path per row (slots 1..m, root first) and next_tokens (b,), the target's token
    after the path.
    """
    greedy_tokens = target_logits.max(-1).indices.tolist()  # (b, m + 1)
    tokens, parent_slots, counts = draft_tokens.tolist(), parents.tolist(), num_drafts.tolist()
    paths, next_tokens = [], []
    for i, p in enumerate(params):
        children: dict[tuple[int, int], int] = {}
        for j in range(counts[i]):
            children.setdefault((parent_slots[i][j], tokens[i][j]), j + 1)
        path, slot = [], 0
        while True:
            if p.do_sample:
                token = int(sample(logits_to_probs(target_logits[i, slot], p), generator))
            else:
                token = greedy_tokens[i][slot]
            child = children.get((slot, token))
            if child is None:
                break
            path.append(child)
            slot = child
        paths.append(path)
        next_tokens.append(token)
    return paths, torch.tensor(next_tokens, dtype=torch.long, device=target_logits.device)


def checked_along_paths(parents: torch.Tensor, paths: list[list[int]], num_drafts: list[int]) -> list[int]:
    """Per row, the drafts a tree verified along its accepted path: the path's length, plus one when the
    path's last slot had a verified child (which the target rejected)."""
    parents_list = parents.tolist()
    return [
        len(path) + int((path[-1] if path else 0) in parents_list[i][:n])
        for i, (path, n) in enumerate(zip(paths, num_drafts))
    ]
