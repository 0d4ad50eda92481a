"""Draft trees: the trie's invariants, the 4-D mask, and lossless tree verification end to end."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from scipy.stats import chisquare
from transformers import DynamicCache

from adaflash_hf import DraftingConfig, DraftingState, FixedVerifyLength, generate
from adaflash_hf._compat import CACHE_KWARG
from adaflash_hf.decoding.acceptance import expected_accepted
from adaflash_hf.decoding.draft_tree import (
    ancestor_mask,
    build_tree,
    chain_rates,
    is_chain,
    tree_accept,
    tree_attention_mask,
)
from adaflash_hf.decoding.ngram_index import NGramIndex
from adaflash_hf.decoding.sampling import SamplingParams

from conftest import greedy_reference, left_pad, tiny_target


def random_candidates(seed: int, count: int = 6, vocab: int = 4, length: int = 6):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randint(0, vocab, (length,), generator=g).tolist(), torch.rand(length, generator=g).tolist())
        for _ in range(count)
    ]


@pytest.mark.parametrize("seed", range(20))
def test_tree_invariants(seed):
    """Parents come first (so every prefix is a tree), children fit under their parent's probability,
    every node spells a prefix of some candidate, and limits hold."""
    candidates = random_candidates(seed)
    tree = build_tree(candidates, max_nodes=12, max_depth=4)
    assert 0 < len(tree) <= 12
    paths = {}
    for j, (token, parent, depth) in enumerate(zip(tree.tokens, tree.parents, tree.depths)):
        assert parent <= j  # slot j + 1's parent is the anchor (0) or an earlier node
        assert depth == (1 if parent == 0 else tree.depths[parent - 1] + 1) <= 4
        paths[j + 1] = paths.get(parent, ()) + (token,)
        assert any(tuple(c[:depth]) == paths[j + 1] for c, _ in candidates)
        assert tree.probs[j] <= (1.0 if parent == 0 else tree.probs[parent - 1]) + 1e-12
    assert len(set(paths.values())) == len(paths)  # shared prefixes are merged, never duplicated
    for parent in {0, *range(1, len(tree) + 1)}:
        budget = 1.0 if parent == 0 else tree.probs[parent - 1]
        assert sum(p for p, q in zip(tree.probs, tree.parents) if q == parent) <= budget + 1e-9
    assert tree.probs == sorted(tree.probs, reverse=True)


def test_tree_merges_prefixes_and_keeps_the_likeliest_nodes():
    tree = build_tree(
        [([7, 8, 9], [0.9, 0.9, 0.9]), ([7, 8, 5], [0.9, 0.9, 0.5]), ([3], [0.05])], max_nodes=10, max_depth=8
    )
    assert tree.tokens[:2] == [7, 8] and tree.parents[:2] == [0, 1]
    assert sorted(tree.tokens[2:4]) == [5, 9] and tree.parents[2:4] == [2, 2]  # both branch after the shared "7 8"
    assert tree.origins[tree.tokens.index(9)] == 0 and tree.origins[tree.tokens.index(5)] == 1
    assert tree.tokens[-1] == 3  # least likely last
    # the branch's two children (0.729, 0.405) exceed their parent's 0.81 together: scaled to fit
    assert sum(p for p, q in zip(tree.probs, tree.parents) if q == 2) == pytest.approx(0.81)
    assert build_tree([([1, 2, 3], [0.5, 0.0, 1.0])], 8, 8).tokens == [1]  # an unreachable node is dropped
    assert len(build_tree(random_candidates(0), max_nodes=3, max_depth=8)) == 3


def test_chain_rates_turn_reach_probabilities_into_the_chain_value():
    probs = [0.9, 0.6, 0.6, 0.2, 0.0]
    rates = chain_rates(probs)
    for k in range(1, len(probs) + 1):
        assert expected_accepted(rates[:k]) == pytest.approx(sum(probs[:k]))


def brute_force_ancestors(parents: list[int]) -> torch.Tensor:
    m = len(parents)
    mask = torch.zeros(m + 1, m + 1, dtype=torch.bool)
    for q in range(m + 1):
        k = q
        while True:
            mask[q, k] = True
            if k == 0:
                break
            k = parents[k - 1]
    return mask


def test_ancestor_mask_and_depths_match_a_walk_up_the_tree():
    rows = [build_tree(random_candidates(s), 10, 6) for s in range(3)]
    width = max(len(t) for t in rows)
    parents = torch.zeros(3, width, dtype=torch.long)
    for i, t in enumerate(rows):
        parents[i, : len(t)] = torch.tensor(t.parents)
    mask = ancestor_mask(parents)
    for i, t in enumerate(rows):
        assert torch.equal(mask[i], brute_force_ancestors(parents[i].tolist()))
        assert [0, *t.depths] == mask[i, : len(t) + 1].sum(-1).sub(1).tolist()  # depth = ancestors excluding itself
    assert is_chain(torch.tensor([[0, 1, 2]]), torch.tensor([3]))
    assert not is_chain(torch.tensor([[0, 0, 2]]), torch.tensor([3]))
    assert is_chain(torch.tensor([[0, 1, 0]]), torch.tensor([2]))  # only the verified prefix counts


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_tree_forward_gives_every_node_the_logits_of_its_own_path(arch, attention):
    """One forward over a tree (cache with holes, 4-D mask, positions by depth) == a plain forward of each path."""
    target = tiny_target(arch)
    target.config._attn_implementation = attention
    prompt = [5, 9, 14, 20, 7, 11]
    tree = build_tree([([4, 6, 8, 10], [0.9] * 4), ([4, 6, 9], [0.9, 0.9, 0.8]), ([13, 2], [0.3, 0.9])], 8, 8)
    with torch.no_grad():
        cache = DynamicCache()
        target(
            input_ids=torch.tensor([prompt + [30]]), use_cache=True, **{CACHE_KWARG: cache}
        )  # slot 6 is a hole below
        slot_mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0]])
        anchor = 12
        parents = torch.tensor([tree.parents])
        ids = torch.tensor([[anchor, *tree.tokens]])
        positions = len(prompt) + torch.tensor([[0, *tree.depths]])
        out = target(
            input_ids=ids,
            position_ids=positions,
            use_cache=True,
            **{CACHE_KWARG: cache},
            attention_mask=tree_attention_mask(slot_mask, parents, target.dtype),
        )
        paths = {0: [anchor]}
        for j, parent in enumerate(tree.parents):
            paths[j + 1] = paths[parent] + [tree.tokens[j]]
        for slot, path in paths.items():
            plain = target(input_ids=torch.tensor([prompt + path])).logits[0, -1]
            torch.testing.assert_close(out.logits[0, slot], plain, atol=1e-4, rtol=1e-4)


def test_tree_accept_greedy_follows_the_argmax_through_the_branches():
    V = 10
    # nodes: slot1 = 4 (child of anchor), slot2 = 5 (anchor), slot3 = 6 (child of slot 2), slot4 = 7 (slot 2)
    tokens, parents = torch.tensor([[4, 5, 6, 7]]), torch.tensor([[0, 0, 2, 2]])
    logits = torch.zeros(1, 5, V)
    logits[0, 0, 5] = logits[0, 2, 7] = logits[0, 4, 1] = 1.0  # anchor -> 5, slot 2 -> 7, slot 4 -> 1 (no child)
    paths, nxt = tree_accept(tokens, parents, logits, torch.tensor([4]), [SamplingParams()])
    assert paths == [[2, 4]] and nxt.tolist() == [1]
    paths, nxt = tree_accept(tokens, parents, logits, torch.tensor([3]), [SamplingParams()])  # slot 4 not verified
    assert paths == [[2]] and nxt.tolist() == [7]


def test_tree_accept_sampling_reproduces_the_target_law():
    """Sampling through a tree: the first two emitted tokens follow p(x1) p(x2 | x1) exactly."""
    V, N = 5, 40_000
    g = torch.Generator().manual_seed(0)
    p1 = torch.softmax(torch.randn(V, generator=g) * 1.5, -1)
    p2 = torch.softmax(torch.randn(V, V, generator=g) * 1.5, -1)  # row = x1
    # a tree with branches 1 -> {2, 3} and 0: slot 1 = token 1, slot 2 = token 0, slot 3 = 2 (under 1),
    # slot 4 = 3 (under 1)
    tokens, parents = torch.tensor([[1, 0, 2, 3]]), torch.tensor([[0, 0, 1, 1]])
    logits = torch.stack([p1, p2[1], p2[0], p2[2], p2[3]]).log()[None]  # slot q predicts the token after its path
    params = [SamplingParams(do_sample=True)]
    rng = torch.Generator().manual_seed(1)
    counts = torch.zeros(V, V)
    for _ in range(N):
        path, nxt = tree_accept(tokens, parents, logits, torch.tensor([4]), params, rng)
        emitted = [tokens[0, j - 1].item() for j in path[0]] + nxt.tolist()
        if len(emitted) == 1:  # no draft accepted: the second token is a fresh sample after x1
            emitted.append(int(torch.multinomial(p2[emitted[0]], 1, generator=rng)))
        counts[emitted[0], emitted[1]] += 1
    expected = (p1[:, None] * p2).flatten().double()
    assert chisquare(counts.flatten().double().numpy(), (expected / expected.sum() * N).numpy()).pvalue > 1e-3


def test_ngram_branches_start_with_the_runner_up_tokens():
    index = NGramIndex(max_n=2)
    index.start_stream([1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 5, 6])
    branches = index.propose_branches([9, 1, 2], max_len=3, branches=3)
    assert [b[0] for b in branches] == [[3, 4, 1], [5, 6]]  # the most frequent next token first, then the runner-up
    assert branches[0][0] == index.propose([9, 1, 2], 3)[0]
    # its first token: position 0, a 2-gram seen once, not unanimous, rank 1
    assert branches[1][1][0] == (0, 2, 1, False, 1)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_engine_verifies_trees_losslessly(arch):
    """fp32 greedy: a batch whose suffix indices branch (repeated n-grams with different continuations)
    verifies trees, and every row's output equals the target's own."""
    target = tiny_target(arch)
    motifs = [[5, 6, 7, 8, 5, 6, 9, 10, 5, 6, 7, 11, 5, 6], [20, 21, 22, 20, 21, 23, 20, 21], [30, 31, 32, 33]]
    prompts = [greedy_reference(target, m, 8, eos=False) + m for m in motifs]  # the target's own loops, then the motif
    ids, mask = left_pad(prompts)
    out = generate(
        target,
        None,
        ids,
        mask,
        max_new_tokens=24,
        do_sample=False,
        eos_token_id=None,
        drafting=DraftingConfig(global_index=False),
        verify_policy=FixedVerifyLength(),
        drafting_state=DraftingState(),
    )
    rounds = out.stats.rounds
    assert any(r.tree for r in rounds)  # trees were really verified
    # drafts checked along the accepted path: the accepted ones, plus at most the one rejected below them
    for r in (r for r in rounds if r.tree):
        assert all(a <= c <= min(a + 1, v - 1) for a, c, v in zip(r.accept_lengths, r.checked, r.verify_lens))
    for i, prompt in enumerate(prompts):
        new = out.sequences[i, ids.shape[1] : ids.shape[1] + out.num_new_tokens[i]].tolist()
        assert new == greedy_reference(target, prompt, 24, eos=False)[len(prompt) :]
    chain = generate(
        target,
        None,
        ids,
        mask,
        max_new_tokens=24,
        do_sample=False,
        eos_token_id=None,
        drafting=DraftingConfig(global_index=False, tree_nodes=0),
        verify_policy=FixedVerifyLength(),
        drafting_state=DraftingState(),
    )
    assert not any(r.tree for r in chain.stats.rounds)
    assert torch.equal(chain.sequences, out.sequences)


def test_tree_settings_are_validated_and_a_lone_drafter_stays_a_chain():
    with pytest.raises(ValueError, match="tree_nodes"):
        DraftingConfig(tree_nodes=-1)
    with pytest.raises(ValueError, match="branches"):
        DraftingConfig(branches=0)
    from adaflash_hf.decoding.proposers.hybrid import HybridProposer

    assert not HybridProposer(
        DraftingState(), DraftingConfig.only("drafter"), SimpleNamespace(block_size=4)
    ).trees  # nothing to merge
    assert HybridProposer(DraftingState(), DraftingConfig.only("suffix"), drafter=None).trees  # runner-up branches
    one_candidate = DraftingConfig(drafter=False, global_index=False, datastore=False, branches=1)
    assert not HybridProposer(DraftingState(), one_candidate, drafter=None).trees
