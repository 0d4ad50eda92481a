"""The batched engine is lossless: fp32 greedy output equals the target's own, row by row."""

from __future__ import annotations

import pytest
import torch

from adaflash_hf import DraftingConfig, FixedVerifyLength, generate

from conftest import EOS, OracleDrafter, drafter_only, greedy_reference, left_pad, random_prompts

LENGTHS = (3, 9, 5, 12, 7)
DRAFTER_ONLY = dict(drafting=DraftingConfig.only("drafter"), verify_policy=FixedVerifyLength())  # the block, whole


def expected_rows(target, prompts, max_new_tokens):
    return [greedy_reference(target, p, max_new_tokens)[len(p) :] for p in prompts]


def generated_rows(out, width):
    return [row[width : width + n] for row, n in zip(out.sequences.tolist(), out.num_new_tokens)]


def test_random_drafter_batch_matches_target(target, drafter):
    prompts = random_prompts(LENGTHS)
    ids, mask = left_pad(prompts)
    out = generate(target, drafter, ids, mask, max_new_tokens=12, eos_token_id=None)
    assert generated_rows(out, ids.shape[1]) == [greedy_reference(target, p, 12, eos=False)[len(p) :] for p in prompts]
    assert out.sequences.shape == (len(prompts), ids.shape[1] + 12)


@pytest.mark.parametrize("error_rate", [0.0, 0.15, 0.4])
def test_oracle_drafter_ragged_acceptance(target, drafter, error_rate):
    prompts = random_prompts(LENGTHS, seed=2)
    ids, mask = left_pad(prompts)
    width = ids.shape[1]
    references = {width - len(p): greedy_reference(target, p, 40, eos=False) for p in prompts}
    oracle = OracleDrafter(drafter.config).setup(target, references, error_rate).eval()
    out = generate(target, oracle, ids, mask, max_new_tokens=30, eos_token_id=EOS, **DRAFTER_ONLY)
    assert generated_rows(out, width) == expected_rows(target, prompts, 30)
    accepts = [a for r in out.stats.rounds for a in r.accept_lengths]
    block = drafter.config.block_size
    if error_rate == 0.0:
        assert max(accepts) == block - 1  # full blocks accepted
        assert out.mean_accepted_length > 3
    else:
        assert len(set(accepts)) > 2  # ragged: rows advance by different amounts
    # rows retire independently: later rounds run on fewer rows
    assert len(out.stats.rounds[-1].rows) < len(prompts) or len(set(out.num_new_tokens)) == 1


def test_eos_inside_accepted_block_and_budget(target, drafter):
    """A full-block oracle accepts past EOS and past max_new_tokens; the output must still stop there."""
    prompts = random_prompts((4, 6, 8, 10), seed=5)
    ids, mask = left_pad(prompts)
    width = ids.shape[1]
    references = {width - len(p): greedy_reference(target, p, 40, eos=False) for p in prompts}
    # make EOS a token that the references actually produce, so some rows stop inside a block
    eos = references[width - len(prompts[0])][len(prompts[0]) + 6]
    oracle = OracleDrafter(drafter.config).setup(target, references, 0.0).eval()
    for max_new in (1, 7, 23):
        out = generate(target, oracle, ids, mask, max_new_tokens=max_new, eos_token_id=eos, **DRAFTER_ONLY)
        want = [greedy_reference(target, p, max_new, eos=False)[len(p) :] for p in prompts]
        want = [w[: w.index(eos) + 1] if eos in w else w for w in want]
        assert generated_rows(out, width) == want
        assert all(len(w) <= max_new for w in generated_rows(out, width))


def test_verify_length_policy_caps_acceptance(target, drafter):
    prompts = random_prompts((5, 8), seed=3)
    ids, mask = left_pad(prompts)
    width = ids.shape[1]
    references = {width - len(p): greedy_reference(target, p, 40, eos=False) for p in prompts}
    oracle = OracleDrafter(drafter.config).setup(target, references, 0.0).eval()
    out = generate(
        target,
        oracle,
        ids,
        mask,
        max_new_tokens=20,
        eos_token_id=None,
        verify_policy=FixedVerifyLength(3),
        drafting=DraftingConfig.only("drafter"),
    )
    assert generated_rows(out, width) == [
        r[len(p) : len(p) + 20] for p, r in zip(prompts, [references[width - len(p)] for p in prompts])
    ]
    assert max(a for r in out.stats.rounds for a in r.accept_lengths) == 2
    assert out.accept_rate == pytest.approx(1.0)


def test_streaming_and_callbacks(target, drafter):
    prompts = random_prompts((6,), seed=4)
    ids, mask = left_pad(prompts)
    seen, streamed = [], []

    class Streamer:
        def put(self, value):
            streamed.append(value.flatten().tolist())

        def end(self):
            streamed.append("end")

    out = generate(
        target,
        drafter,
        ids,
        max_new_tokens=10,
        eos_token_id=None,
        streamer=Streamer(),
        on_tokens=lambda row, toks: seen.extend(toks),
    )
    new = out.sequences[0, ids.shape[1] :].tolist()
    assert streamed[0] == prompts[0] and streamed[-1] == "end"
    assert sum(streamed[1:-1], []) == new == seen


def test_stats_are_consistent(target, drafter):
    ids, mask = left_pad(random_prompts((4, 7)))
    out = generate(target, drafter, ids, mask, max_new_tokens=8, eos_token_id=None)
    rounds = out.stats.rounds
    assert all(len(r.rows) == len(r.accept_lengths) == len(r.verify_lens) for r in rounds)
    assert all(0 <= a <= v - 1 for r in rounds for a, v in zip(r.accept_lengths, r.verify_lens))
    assert 1.0 <= out.mean_accepted_length <= drafter.config.block_size
    assert out.stats.draft_time > 0 and out.stats.verify_time > 0
    # tokens per row = 1 (prefill) + sum over rounds of (accepted + 1), before cut-offs
    assert all(n == 8 for n in out.num_new_tokens)


def test_sampling_runs_and_is_reproducible(target, drafter):
    ids, mask = left_pad(random_prompts((4, 7)))
    kwargs = dict(max_new_tokens=10, do_sample=True, temperature=0.8, top_k=20, top_p=0.9, eos_token_id=None)
    # reproducible given the seed and deterministic draft choices: one source, a fixed verify length and
    # a fresh state (the default state and the goodput choices learn from earlier calls and timings)
    a = generate(target, drafter, ids, mask, generator=torch.Generator().manual_seed(0), **drafter_only(), **kwargs)
    b = generate(target, drafter, ids, mask, generator=torch.Generator().manual_seed(0), **drafter_only(), **kwargs)
    assert torch.equal(a.sequences, b.sequences)
    c = generate(target, drafter, ids, mask, draft_sampling=True, generator=torch.Generator().manual_seed(0), **kwargs)
    assert c.sequences.shape[0] == 2


def test_max_length_default_and_list_of_stop_ids(target, drafter):
    ids = torch.tensor([random_prompts((6,), seed=8)[0]])
    want = target.generate(ids, max_length=14, do_sample=False, eos_token_id=None)
    out = generate(target, drafter, ids, max_length=14, eos_token_id=None)
    assert out.sequences.tolist() == want.tolist()
    stop = want[0, 9].item()
    out = generate(target, drafter, ids, max_new_tokens=8, eos_token_id=[EOS, stop])
    new = out.sequences[0, 6 : 6 + out.num_new_tokens[0]].tolist()
    assert new[-1] == stop and new == want[0, 6 : 6 + len(new)].tolist()
