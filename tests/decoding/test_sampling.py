"""Rejection sampling reproduces the target distribution exactly (a chi-square test on many draws)."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from adaflash_hf.decoding.sampling import (
    SamplingParams,
    greedy_accept,
    logits_to_probs,
    rejection_accept,
)

V = 6
N = 60_000


def two_step_target():
    """p(x1) and p(x2 | x1) over a small vocabulary; position 2 depends on the first token."""
    g = torch.Generator().manual_seed(0)
    p1 = torch.softmax(torch.randn(V, generator=g) * 1.5, -1)
    p2 = torch.softmax(torch.randn(V, V, generator=g) * 1.5, -1)  # row = x1
    return p1, p2


@pytest.mark.parametrize("draft_kind", ["argmax", "sampled"])
def test_speculative_sampling_matches_target_joint(draft_kind):
    """Draft two tokens, verify, and check the joint law of the first two emitted tokens."""
    p1, p2 = two_step_target()
    g = torch.Generator().manual_seed(1)
    q1 = torch.softmax(torch.randn(V, generator=g), -1)
    q2 = torch.softmax(torch.randn(V, generator=g), -1)  # a deliberately wrong drafter
    if draft_kind == "argmax":
        d1 = torch.full((N,), int(q1.argmax()))
        d2 = torch.full((N,), int(q2.argmax()))
        draft_probs = None
    else:
        d1 = torch.multinomial(q1, N, replacement=True, generator=g)
        d2 = torch.multinomial(q2, N, replacement=True, generator=g)
        draft_probs = torch.stack([q1.expand(N, V), q2.expand(N, V)], dim=1)  # (N, 2, V)
    drafts = torch.stack([d1, d2], dim=1)  # (N, 2)
    # target probabilities at the three verified positions given the drafted prefix
    target_probs = torch.stack([p1.expand(N, V), p2[d1], p2[d2]], dim=1)  # (N, 3, V); 3rd unused in joint
    accept, nxt = rejection_accept(drafts, target_probs, torch.full((N,), 2), draft_probs, generator=g)
    first = torch.where(accept >= 1, d1, nxt)
    # the second emitted token: d2 if accepted, the correction if rejected at 2, else a fresh sample
    second = torch.where(
        accept >= 2, d2, torch.where(accept == 1, nxt, torch.multinomial(p2[first], 1, generator=g).squeeze(1))
    )
    joint = torch.bincount(first * V + second, minlength=V * V).double()
    expected = (p1[:, None] * p2).flatten().double() * N
    assert chisquare(joint.numpy(), expected.numpy()).pvalue > 1e-3


def test_speculative_sampling_detects_a_biased_sampler():
    """The statistical test has power: sampling straight from the drafter fails it."""
    p1, _ = two_step_target()
    q1 = torch.softmax(torch.randn(V, generator=torch.Generator().manual_seed(1)), -1)
    draws = torch.multinomial(q1, N, replacement=True, generator=torch.Generator().manual_seed(2))
    assert chisquare(torch.bincount(draws, minlength=V).double().numpy(), (p1.double() * N).numpy()).pvalue < 1e-6


def test_processed_distribution_top_k_top_p_temperature():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])
    probs = logits_to_probs(logits, SamplingParams(do_sample=True, temperature=0.5, top_k=4, top_p=0.9))
    assert probs[0, 4:].sum() == 0  # top-k removed
    kept = (probs[0] > 0).sum()
    full = torch.softmax(logits / 0.5, -1)[0, :4]
    full = full / full.sum()
    # top-p keeps the smallest prefix reaching 0.9 of the top-k mass
    assert full[: kept - 1].sum() < 0.9 <= full[:kept].sum() + 1e-6
    assert torch.allclose(probs.sum(-1), torch.ones(1))


def test_greedy_accept_prefix_and_caps():
    logits = torch.zeros(2, 4, 5)
    best = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4]])
    logits.scatter_(-1, best[..., None], 1.0)
    drafts = torch.tensor([[1, 2, 0], [1, 2, 3]])
    accept, nxt = greedy_accept(drafts, logits, torch.tensor([3, 2]))
    assert accept.tolist() == [2, 2] and nxt.tolist() == [3, 3]


def test_sampling_params_validation():
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(do_sample=True, temperature=0.0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(do_sample=True, top_p=1.5)


@pytest.mark.parametrize("mode", ["drafter-argmax", "drafter-sampled", "suffix", "hybrid", "tree"])
def test_engine_sampling_reproduces_target_distribution(mode):
    """End to end: the engine's (x1, x2, x3) over many rows follows the target's own sampling law,
    whichever source the drafts came from (a drafter's argmax or sampled block, suffix matches, or both,
    as a chain or, with one-hot drafts, as a draft tree)."""
    from adaflash_hf import AdaFlashDrafter, DraftingConfig, DraftingState, FixedVerifyLength, generate

    from conftest import VOCAB, OracleDrafter, drafter_only, greedy_reference, tiny_target

    target = tiny_target("llama", seed=7)
    prompt = [5, 9, 14, 20]
    if mode in ("suffix", "hybrid", "tree"):  # the target's own greedy loop (38, 24, 38, 24, ...) gives suffix matches
        prompt = greedy_reference(target, prompt, 6, eos=False)
    if (
        mode == "tree"
    ):  # each likely x1 (a superset of the support) followed by two different tokens: the suffix index branches
        prompt = [
            u
            for t in (5, 9, 16, 23, 24, 25, 29, 38)
            for u in (t, 4 + (t + 1) % (VOCAB - 4), t, 4 + (t + 2) % (VOCAB - 4))
        ] + prompt
    drafter = AdaFlashDrafter.from_target(target, num_layers=1, block_size=4).eval()
    oracle = (
        OracleDrafter(drafter.config).setup(target, {0: greedy_reference(target, prompt, 12, eos=False)}, 0.3).eval()
    )
    params = SamplingParams(do_sample=True, temperature=1.5, top_k=3)
    rows = 3000
    ids = torch.tensor([prompt] * rows)
    if mode.startswith("drafter"):
        choice = drafter_only()
    else:
        choice = dict(
            drafting=DraftingConfig.only("suffix") if mode == "suffix" else DraftingConfig(global_index=False),
            verify_policy=FixedVerifyLength(),
            drafting_state=DraftingState(),
        )
    out = generate(
        target,
        oracle if mode != "suffix" else None,
        ids,
        torch.ones_like(ids),
        max_new_tokens=3,
        do_sample=True,
        temperature=1.5,
        top_k=3,
        top_p=None,
        eos_token_id=None,
        draft_sampling=mode not in ("drafter-argmax", "tree"),
        generator=torch.Generator().manual_seed(3),
        **choice,
    )
    assert out.accept_rate > (
        0.02 if mode == "tree" else 0.05
    )  # drafts were really accepted (a tree verifies more of them)
    if mode not in ("suffix", "tree"):
        assert any(s == "drafter" for r in out.stats.rounds for s in r.sources)
    if mode in ("suffix", "hybrid"):
        assert out.stats.source_counts()["suffix"][1] > 0  # suffix drafts were accepted
    assert any(r.tree for r in out.stats.rounds) == (mode == "tree")  # sampled drafter blocks are verified as chains
    new = out.sequences[:, len(prompt) :]  # (rows, 3)

    with torch.no_grad():
        p1 = logits_to_probs(target(torch.tensor([prompt])).logits[0, -1], params)
        support = p1.nonzero().flatten().tolist()
        observed, expected = [], []
        for x1 in support:
            p2 = logits_to_probs(target(torch.tensor([prompt + [x1]])).logits[0, -1], params)
            for x2 in p2.nonzero().flatten().tolist():
                observed.append(int(((new[:, 0] == x1) & (new[:, 1] == x2)).sum()))
                expected.append(float(p1[x1] * p2[x2]) * rows)
    assert sum(observed) == rows  # nothing outside the processed support
    expected = [e * rows / sum(expected) for e in expected]  # remove float rounding of the total
    assert chisquare(observed, expected).pvalue > 1e-3
