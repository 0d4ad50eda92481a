"""A drafter or length head that raises, or returns NaN, in a round makes that round a plain step for the rows
concerned: the request goes on, the output stays the target's own (fp32 greedy), and the round's statistics count
the failure (``draft_failures``, which the serving layer reads from every round)."""

from __future__ import annotations

import logging
from dataclasses import replace
from types import SimpleNamespace

import torch

from adaflash_hf import DraftingConfig, DraftingState, FixedVerifyLength, LengthHeadVerifyLength, generate
from adaflash_hf.decoding.cost import VerifyCostModel
from adaflash_hf.decoding.proposers import drafter as drafter_module

from conftest import greedy_reference, left_pad, random_prompts

EVERY_ROUND = replace(DraftingConfig.only("drafter"), drafter_every_round=True)


def _generated(out, width: int) -> list[list[int]]:
    return [row[width : width + n] for row, n in zip(out.sequences.tolist(), out.num_new_tokens)]


def test_a_drafter_that_raises_mid_pass_costs_its_rows_one_round_of_drafts(target, drafter, caplog):
    prompts = random_prompts((5, 9), seed=2)
    ids, mask = left_pad(prompts)
    passes = []

    def fail_second_pass(module, args, output):  # after the first layer has written this pass into the cache
        passes.append(1)
        if len(passes) == 2:
            raise RuntimeError("injected drafter fault")

    hook = drafter.layers[1].register_forward_hook(fail_second_pass)
    try:
        with caplog.at_level(logging.WARNING):
            out = generate(
                target,
                drafter,
                ids,
                mask,
                max_new_tokens=16,
                eos_token_id=None,
                drafting=EVERY_ROUND,
                verify_policy=FixedVerifyLength(None),
                drafting_state=DraftingState(EVERY_ROUND),
            )
    finally:
        hook.remove()
    assert _generated(out, ids.shape[1]) == [greedy_reference(target, p, 16, eos=False)[len(p) :] for p in prompts]
    assert out.stats.draft_failures == 2 and [r.draft_failures for r in out.stats.rounds][1] == 2
    assert out.stats.rounds[1].sources == ["none", "none"]  # a plain step for both rows
    assert any("drafter" in r.sources for r in out.stats.rounds[2:])  # and the drafter drafts again afterwards
    assert "The drafter failed this round" in caplog.text


def test_a_drafter_that_returns_nan_costs_its_rows_one_round_of_drafts(target, drafter, monkeypatch, caplog):
    prompts = random_prompts((6, 4), seed=3)
    ids, mask = left_pad(prompts)
    real, calls = drafter_module.draft_block, []

    def nan_on_third_pass(*args):
        calls.append(1)
        hidden = real(*args)
        return hidden * float("nan") if len(calls) == 3 else hidden

    monkeypatch.setattr(drafter_module, "draft_block", nan_on_third_pass)
    with caplog.at_level(logging.WARNING):
        out = generate(
            target,
            drafter,
            ids,
            mask,
            max_new_tokens=12,
            eos_token_id=None,
            drafting=EVERY_ROUND,
            verify_policy=FixedVerifyLength(None),
            drafting_state=DraftingState(EVERY_ROUND),
        )
    assert _generated(out, ids.shape[1]) == [greedy_reference(target, p, 12, eos=False)[len(p) :] for p in prompts]
    assert out.stats.draft_failures == 2 and out.stats.rounds[2].sources == ["none", "none"]
    assert "non-finite probabilities" in caplog.text


class BrokenHead:
    """A length head that raises, or gives row 0 of every call NaN rates."""

    device, dtype = torch.device("cpu"), torch.float32

    def __init__(self, mode: str):
        self.mode = mode

    def __call__(self, hidden, prior):
        if self.mode == "raise":
            raise RuntimeError("injected length head fault")
        rates = torch.full_like(prior, 0.9)
        rates[0] = float("nan")
        return SimpleNamespace(rates=rates)


def test_a_length_head_that_fails_makes_its_rows_verify_only_their_anchor(caplog):
    policy = LengthHeadVerifyLength(BrokenHead("nan"), cost_model=VerifyCostModel(prior_slope=0.0))
    with caplog.at_level(logging.WARNING):
        lengths = policy.verify_lens(torch.full((2, 4), 0.9), torch.randn(2, 5, 8), ["drafter", "drafter"])
    assert lengths[0] == 1 and lengths[1] > 1 and policy.failed_rows == [0]
    policy.head = BrokenHead("raise")
    lengths = policy.verify_lens(torch.full((2, 4), 0.9), torch.randn(2, 5, 8), ["drafter", "suffix"])
    assert lengths[0] == 1 and policy.failed_rows == [0]
    assert "The length head failed this round" in caplog.text and "non-finite rates" in caplog.text


def test_a_failing_length_head_never_fails_a_request(target, drafter):
    prompts = random_prompts((7,), seed=5)
    ids, mask = left_pad(prompts)
    for mode in ("raise", "nan"):
        policy = LengthHeadVerifyLength(BrokenHead(mode), cost_model=VerifyCostModel(prior_slope=0.0))
        out = generate(
            target,
            drafter,
            ids,
            mask,
            max_new_tokens=10,
            eos_token_id=None,
            drafting=EVERY_ROUND,
            verify_policy=policy,
            drafting_state=DraftingState(EVERY_ROUND),
        )
        assert _generated(out, ids.shape[1]) == [greedy_reference(target, p, 10, eos=False)[len(p) :] for p in prompts]
        assert 0 < out.stats.draft_failures <= out.stats.num_rounds  # one row: at most once a round
