"""Draft sources and the choice between them: suffix index, acceptance estimates, goodput lengths, draft vocabulary.

The end-to-end invariant is the same as everywhere: fp32 greedy output equals the target's own,
whichever source drafted (and the sampling tests in test_sampling.py cover the distribution).
"""

from __future__ import annotations

import contextlib
import math
from collections import deque

import pytest
import torch

from adaflash_hf import AdaFlashDrafter, DraftingConfig, DraftingState, FixedVerifyLength, GoodputVerifyLength, generate
from adaflash_hf.decoding.acceptance import PRIOR_FILE, AcceptanceEstimator, expected_accepted, load_acceptance_prior
from adaflash_hf.decoding.cost import VerifyCostModel
from adaflash_hf.decoding.datastore_file import load_datastore, save_datastore
from adaflash_hf.decoding.draft_head import DraftHead
from adaflash_hf.decoding.ngram_index import NGramIndex
from adaflash_hf.decoding.policy import verify_limit
from adaflash_hf.decoding.proposers import drafter as drafter_module
from adaflash_hf.decoding.proposers.drafter import DrafterBlock, drafter_bucket
from adaflash_hf.decoding.proposers.hybrid import HybridProposer
from adaflash_hf.decoding.throughput_guard import ThroughputGuard, pooled_bound
from adaflash_hf.dflash_format import save_dflash_checkpoint
from adaflash_hf.training.data import TrainingSequence
from adaflash_hf.training.vocab import coverage, most_frequent, response_token_counts

from conftest import OracleDrafter, greedy_reference, left_pad, random_prompts


def test_ngram_index_proposes_the_most_frequent_continuation_and_backs_off():
    index = NGramIndex(max_n=3)
    index.start_stream([1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3, 5])
    tokens, features = index.propose([9, 1, 2, 3], max_len=1)
    assert tokens == [5] and features[0] == (0, 3, 2, False)  # position 0: (1, 2, 3) -> 5 twice, 4 once
    tokens, _ = index.propose([7, 7, 1], max_len=3)  # (7, 7, 1) and (7, 1) unseen: backs off to (1,)
    assert tokens == [2, 3, 5]
    assert index.propose([42], max_len=4) == ([], [])  # nothing matches: no candidate


def test_ngram_index_streams_do_not_join_and_eviction_forgets_exactly():
    index = NGramIndex(max_n=2, max_tokens=6)
    index.start_stream([1, 2, 3])
    index.start_stream([4, 5, 6])
    assert index.propose([3], 1) == ([], [])  # 3 ended a stream: no n-gram spans two streams
    index.start_stream([7, 8, 9])  # 9 tokens > 6: the oldest stream is evicted
    fresh = NGramIndex(max_n=2)
    fresh.start_stream([4, 5, 6])
    fresh.start_stream([7, 8, 9])
    assert index._next == fresh._next and index.num_tokens == 6


def test_acceptance_estimator_starts_at_the_prior_and_converges_to_the_observed_rate():
    est = AcceptanceEstimator(prior_weight=4.0, max_count=100.0)
    assert est.rate("suffix", (2, 1, True)) == pytest.approx(AcceptanceEstimator.PRIORS["suffix"])
    for _ in range(300):  # 3 drafts verified, first accepted, second rejected, third never reached
        est.update("suffix", [(2, 1, True), (1, 1, True), (1, 1, False)], num_verified=3, num_accepted=1)
    assert est.rate("suffix", (2, 1, True)) > 0.95
    assert est.rate("suffix", (1, 1, True)) < 0.05
    assert ("suffix", (1, 1, False)) not in est.seen  # unreached drafts teach nothing
    assert est.seen[("suffix", (2, 1, True))] <= 100.0  # bounded counters


def test_expected_accepted_is_the_sum_of_survival_products():
    assert expected_accepted([]) == 0.0
    assert expected_accepted([1.0, 1.0, 1.0]) == 3.0
    assert expected_accepted([0.5, 0.5]) == pytest.approx(0.5 + 0.25)
    assert expected_accepted([0.0, 1.0]) == 0.0


def test_goodput_policy_takes_a_plain_step_when_nothing_pays_and_the_whole_candidate_when_it_is_free():
    cost = VerifyCostModel()
    for n in range(1, 9):
        cost.update(n, 0.020)  # flat cost: verifying 8 tokens costs one step
    policy = GoodputVerifyLength(cost_model=cost)
    assert policy.verify_lens(torch.zeros(2, 7), None).tolist() == [1, 1]
    assert policy.verify_lens(torch.full((2, 7), 0.9), None).tolist() == [8, 8]
    steep = VerifyCostModel()
    for n in range(1, 17):
        steep.update(n, 0.020 * n)  # every token costs a step: drafts never pay unless certain
    assert GoodputVerifyLength(cost_model=steep).verify_lens(torch.full((1, 7), 0.5), None).tolist() == [1]


def test_verify_cost_model_averages_and_extrapolates_from_measurements():
    cost = VerifyCostModel(prior_slope=0.1, decay=0.5)
    assert cost.cost(5) == pytest.approx(1.4)  # prior only
    cost.update(4, 1.0)
    cost.update(4, 2.0)
    assert cost.cost(4) == pytest.approx(1.5)
    assert cost.cost(6) == pytest.approx(1.5 * 1.2)
    assert cost.cost(2) == pytest.approx(1.5 / 1.2)


def test_verify_cost_tables_stay_monotone_and_fresh_measurements_win():
    cost = VerifyCostModel(decay=1.0)  # each update replaces its entry, to read the rule plainly
    cost.update(1, 0.070)  # slow first round (cold kernels)
    for n in (5, 9, 13):
        cost.update(n, 0.040 + 0.002 * n)  # trees: the one-token entry is never measured again
    assert cost.cost(1) == pytest.approx(0.050)  # lowered to the fresher 5-token forward
    assert [cost.cost(n) for n in range(1, 14)] == sorted(cost.cost(n) for n in range(1, 14))
    cost.update(2, 0.090)  # a fresh slow 2-token forward raises the larger entries it contradicts
    assert cost.cost(13) == pytest.approx(0.090) and cost.cost(1) == pytest.approx(0.050)
    cost.update(3 * 4, 0.060, rows=3)  # 3 rows of 4 tokens
    cost.update(3 * 2, 0.080, rows=3)  # a slower 2-token one later lowers nothing below, raises width 4
    assert cost.cost_batch(3, 4) == pytest.approx(0.080)
    cost.update(3, 0.100, rows=3)  # plain step of 3 rows, fresh and slow: the wider entries follow it
    assert cost.cost_batch(3, 2) == pytest.approx(0.100) and cost.row_seconds[3] == pytest.approx(0.100)


def test_batched_cost_interpolates_along_rows_at_a_measured_width():
    cost = VerifyCostModel()
    cost.update(1, 0.010)
    cost.update(4, 0.012)
    for rows, seconds in ((4, 0.020), (16, 0.080)):
        cost.update(rows * 1, seconds, rows=rows)  # plain steps of 4 and 16 rows
        cost.update(rows * 3, seconds * 2.5, rows=rows)  # verifying 2 drafts per row costs 2.5 plain steps here
    assert cost.cost_batch(16, 3) == pytest.approx(0.200)  # measured
    assert cost.cost_batch(8, 3) == pytest.approx(0.050 + (0.200 - 0.050) * 4 / 12)  # along rows at width 3
    assert cost.cost_batch(8, 3) / cost.cost_batch(8, 1) == pytest.approx(2.5)  # not the one-row ratio (0.012 / 0.010)
    # below the measured rows: the plain step of 2 rows (0.010, along rows) scaled as one row's cost grows from 2 to
    # 6 tokens
    assert cost.cost_batch(2, 3) == pytest.approx(0.010 * cost.cost(6) / cost.cost(2))


def test_the_guard_holds_plain_steps_where_speculation_realises_less_and_explores():
    cost = VerifyCostModel()
    cost.update(16, 0.100, rows=16)  # a plain step of 16 rows
    policy = GoodputVerifyLength(
        cost_model=cost,
        explore_every=4,
        max_explore_every=16,
        refresh_plain_every=8,
        explore_budget=0.125,
        desync_per_row=0.0,
        burst_rounds=1,
        min_evidence=1,
    )
    plain, spec = torch.ones(16, dtype=torch.long), torch.full((16,), 5, dtype=torch.long)
    assert policy.wants_drafts(16)  # no evidence yet: speculate
    policy.update(torch.full((16,), 1), spec, 0.300)  # 2 tokens per row in 3 plain steps' time: worse
    policy.update(torch.zeros(16, dtype=torch.long), plain, 0.100)  # 1 token per row in one step
    assert policy.rate(5, True) == pytest.approx(2 / 3) and policy.rate(5, False) == pytest.approx(1.0)
    held = []
    for _ in range(
        30
    ):  # as the engine runs: a held round is a plain step, an explored one speculates (and loses again)
        held.append(policy.wants_drafts(16))
        if held[-1]:
            policy.update(torch.full((16,), 1), spec, 0.300)
        else:
            policy.update(torch.zeros(16, dtype=torch.long), plain, 0.100)
    explored = [i for i, h in enumerate(held) if h]
    # explore_every rounds after the first loss, then far enough apart that each loss (1 plain step's time) wastes an
    # eighth of the time: every 8 rounds, not more rarely with every loss (one unlucky round cannot hold plain for long)
    assert explored == [2, 10, 18, 26] and policy.guard.explore[5] == 8
    budgeted = GoodputVerifyLength(
        cost_model=cost, explore_every=4, max_explore_every=256, desync_per_row=0.0, burst_rounds=1, min_evidence=1
    )  # budget 0.01
    budgeted.update(torch.zeros(16, dtype=torch.long), plain, 0.100)
    budgeted.update(torch.full((16,), 1), spec, 0.300)  # wastes 3 - 2 = 1 plain step: explore every 100 rounds at most
    assert budgeted.guard.explore[5] == 100
    budgeted.update(
        torch.full((16,), 1), spec, 0.700
    )  # a dear round: the bucket's rate falls to 3.8 / 9.7 tokens per step,
    assert (
        budgeted.guard.explore[5] == 256
    )  # 2 * (9.7 / 3.8 - 1) = 3.1 plain steps lost per round: 310, capped at max_explore_every
    budgeted.update(
        torch.full((16,), 1), spec, 0.205
    )  # one cheap round does not undo that: the interval follows the rates
    assert budgeted.guard.explore[5] == math.ceil(2 * (1 / budgeted.rate(5, True) - 1) / 0.01) == 198
    cheap = GoodputVerifyLength(cost_model=cost, explore_every=4, desync_per_row=0.0, burst_rounds=1, min_evidence=1)
    cheap.update(torch.zeros(16, dtype=torch.long), plain, 0.100)
    cheap.update(torch.full((16,), 1), spec, 0.205)  # a cheap loss (2 tokens in 2.05 steps): soon explored again
    assert cheap.losing(5) and cheap.guard.explore[5] == 5
    fresh = GoodputVerifyLength(cost_model=cost, explore_every=4, desync_per_row=0.0)  # min_evidence 8
    fresh.update(torch.zeros(16, dtype=torch.long), plain, 0.100)
    for _ in range(7):  # a bucket's first speculative rounds (kernel set-up for new shapes) do not back exploring off
        fresh.update(torch.full((16,), 1), spec, 0.700)
        assert fresh.losing(5) and fresh.guard.explore.get(5, 4) == 4
    fresh.update(torch.full((16,), 1), spec, 0.700)
    assert fresh.guard.explore[5] == 256
    assert policy.wants_drafts(4)  # another batch-size bucket: no speculative evidence there yet
    policy.update(torch.zeros(4, dtype=torch.long), torch.full((4,), 5, dtype=torch.long), 0.030)
    assert policy.rate(3, False) == policy.rate(5, False)  # no plain step timed at 4 rows: the 16-row one stands in
    assert not policy.wants_drafts(4)  # 1 token per row in more than a plain step's time: hold plain there too
    for _ in range(
        12
    ):  # speculation now pays at 16 rows: tokens over time climbs past plain's, and the guard lets it through
        policy.update(torch.full((16,), 4), spec, 0.150)
    assert policy.rate(5, True) > policy.rate(5, False)
    assert not policy.wants_drafts(16)  # 12 speculative rounds in a row: time a plain step (refresh_plain_every=8)
    policy.update(torch.zeros(16, dtype=torch.long), plain, 0.100)
    assert policy.wants_drafts(16)


def test_the_guard_explores_and_refreshes_in_runs_of_rounds():
    """A held bucket explores burst_rounds speculative rounds in a row, and a speculating one times that many plain
    steps in a row, so one noisy round cannot flip the decision; a losing run's interval counts all of its rounds."""
    cost = VerifyCostModel()
    cost.update(8, 0.100, rows=8)
    policy = GoodputVerifyLength(
        cost_model=cost,
        explore_every=4,
        refresh_plain_every=6,
        burst_rounds=3,
        desync_per_row=0.0,
        explore_budget=0.1,
        min_evidence=1,
    )
    one, spec, plain = (
        torch.ones(8, dtype=torch.long),
        torch.full((8,), 3, dtype=torch.long),
        torch.ones(8, dtype=torch.long),
    )
    pays = {True: 0.150, False: 0.100}  # speculation first pays (2 tokens in 1.5 steps), later loses (2 tokens in 2.5)
    answers = []
    for i in range(90):
        if i == 30:
            pays[True] = 0.250
        answers.append(policy.wants_drafts(8))
        if answers[-1]:
            policy.update(one, spec, pays[True], proposed=True)
        else:
            policy.update(one * 0, plain, pays[False], proposed=False)
    trace = "".join("S" if a else "." for a in answers)
    assert trace[:30] == "S..." + "SSSSS..." * 3 + "SS"  # plain steps timed three in a row, after 5 speculative rounds
    held = trace[40:]  # speculation now loses: plain steps, with explored runs of exactly three speculative rounds
    assert "SSS" in held and "SSSS" not in held and held.count("S") % 3 == 0 and ".S." not in held
    lost = 2.5 - 2  # plain steps' worth wasted per losing speculative round
    assert policy.guard.explore[4] == max(policy.explore_every, math.ceil(3 * lost / policy.explore_budget)) == 15


def losing_policy_at_16_rows(**kwargs) -> GoodputVerifyLength:
    """A policy that timed a plain step of 16 rows and then saw speculation lose (2 tokens a row in 2.5 steps), so it
    holds that batch size from its next round; it explores every 4 rounds."""
    cost = VerifyCostModel()
    cost.update(16, 0.100, rows=16)
    policy = GoodputVerifyLength(
        cost_model=cost, explore_every=4, max_explore_every=4, desync_per_row=0.0, caps=(), **kwargs
    )
    policy.update(torch.zeros(16, dtype=torch.long), torch.ones(16, dtype=torch.long), 0.100)  # a plain step
    for _ in range(3):
        policy.update(torch.full((16,), 1), torch.full((16,), 5, dtype=torch.long), 0.250)
    return policy


def test_a_held_batch_size_resumes_only_when_its_explored_rounds_beat_plain_with_confidence():
    """One lucky round in an explored burst lifts the burst's rate over plain's but not its lower bound: the hold
    stays. A burst that wins round after round resumes speculation at once."""

    def held_then_burst(burst: list[tuple[int, float]], **kwargs) -> tuple[list[float | None], list[bool]]:
        policy = losing_policy_at_16_rows(burst_rounds=4, **{"resume_min_rounds": 3, **kwargs})
        verify = torch.full((16,), 5, dtype=torch.long)
        answers, bounds, pending = [], [], list(burst)
        for _ in range(12):
            answers.append(policy.wants_drafts(16))
            bounds.append(policy.guard.resume_bound(5))
            if answers[-1] and pending:
                accepted, seconds = pending.pop(0)
                policy.update(torch.full((16,), accepted), verify, seconds)
            elif answers[-1]:
                policy.update(torch.full((16,), 1), verify, 0.110)  # after the burst: 2 tokens in 1.1 steps
            else:
                policy.update(torch.zeros(16, dtype=torch.long), torch.ones(16, dtype=torch.long), 0.100)
        return bounds, answers

    # the burst's first round re-measures and does not count; then 5 tokens in 1.2 steps, 1 in 1.1 twice: 7 in 3.4
    lucky = [(1, 0.110), (4, 0.120), (0, 0.110), (0, 0.110)]
    bounds, answers = held_then_burst(lucky)
    assert answers[:4] == [False, False, False, True]  # held until explored (explore_every 4)
    assert all(answers[4:7]) and not answers[7]  # the burst ran, and the hold stays
    assert 7 / 3.4 > 1.0 / 1.02 > bounds[7]  # the pooled rate beats plain (margin 1.02), its lower bound does not
    assert held_then_burst(lucky, resume_z=0.0)[1][7]  # judged by the pooled rate alone it would have resumed
    steady = [(1, 0.110)] * 4  # 2 tokens in 1.1 steps, every round
    assert all(held_then_burst(steady)[1][3:])  # resumes after the burst and keeps speculating
    answers = held_then_burst(steady, resume_min_rounds=4)[1]  # 3 rounds of a burst count: two bursts needed
    assert not answers[7] and all(answers[11:])
    with pytest.raises(ValueError, match="resume_z"):
        GoodputVerifyLength(resume_z=-1.0)


def test_only_the_burst_rounds_run_as_resumed_speculation_would_count_for_resuming():
    """The first round of an explored burst verifies up to a cap without the slowdown bound; resuming would not run
    that, so it does not vouch for resuming: a burst whose first round wins and whose others verify nothing (the
    policy's own choice there) keeps the hold."""
    policy = losing_policy_at_16_rows(resume_min_rounds=2)
    verify = torch.full((16,), 5, dtype=torch.long)
    seen = []
    for _ in range(12):
        if policy.wants_drafts(16):
            seen.append(policy.guard.remeasuring)
            if policy.guard.remeasuring:  # verified up to the cap: 3 tokens a row in 1.2 steps
                policy.update(torch.full((16,), 2), verify, 0.120)
            else:  # as the policy would run it: drafts dropped, 1 token a row for a proposing round's 1.05 steps
                policy.update(torch.zeros(16, dtype=torch.long), torch.ones(16, dtype=torch.long), 0.105, proposed=True)
        else:
            policy.update(torch.zeros(16, dtype=torch.long), torch.ones(16, dtype=torch.long), 0.100)
    assert seen[:3] == [True, False, False]  # bursts of three, the first re-measuring
    assert 5 in policy.guard.held and len(policy.guard.held[5]) == seen.count(False)  # only those counted: held
    assert policy.guard.resume_bound(5) == pytest.approx(1 / 1.05)


def test_a_speculating_batch_size_is_judged_by_what_its_rounds_realised_not_only_by_its_best_arm():
    """The best verify-length arm's rate is the largest of a few noisy ones and reads high: a batch size whose rounds
    realise less than plain steps is held though the best arm's rate passes the bar."""
    guard = ThroughputGuard(desync_per_row=0.0, min_evidence=100)
    guard.record(5, False, 1.0, 1.0, None)  # plain steps of 16 rows: 1 token a row per step
    assert guard.allows(16, 1.3)
    for _ in range(6):
        guard.record(5, True, 1.8, 2.0, 1.3)  # its rounds realise 0.9 tokens per step; the best arm claims 1.3
    assert guard.own_rate(5) == pytest.approx(0.9) and guard.speculative_rate(5, 1.3) == pytest.approx(0.9)
    assert not guard.allows(16, 1.3) and 5 in guard.held
    steady = ThroughputGuard(desync_per_row=0.0)  # the same best arm over rounds that do realise it keeps speculating
    steady.record(5, False, 1.0, 1.0, None)
    for _ in range(6):
        steady.record(5, True, 2.6, 2.0, 1.3)
    assert steady.allows(16, 1.3)


def test_with_hold_z_a_speculating_batch_size_is_held_only_once_its_rounds_lose_with_confidence():
    """A burst of bad rounds among good ones drags the point estimate under plain's: held at once by default, not with
    hold_z, which needs the recent rounds' upper bound under plain's too; rounds that lose steadily are held either
    way."""

    def guard_after(rounds: list[tuple[float, float]], hold_z: float) -> ThroughputGuard:
        guard = ThroughputGuard(desync_per_row=0.0, min_evidence=100, hold_z=hold_z)
        guard.record(3, False, 1.0, 1.0, None)  # plain steps of 4 rows: 1 token a row per step
        for tokens, steps in rounds:
            guard.record(3, True, tokens, steps, None)
        return guard

    mixed = [(2.0, 1.3)] * 8 + [(1.0, 2.0)] * 4  # good rounds, then four dear ones whose drafts all failed
    assert guard_after(mixed, 0.0).own_rate(3) < 1 / 1.02  # the decayed point estimate loses
    assert not guard_after(mixed, 0.0).allows(4, None)  # held on it
    doubtful = guard_after(mixed, 1.0)
    upper = pooled_bound(doubtful.recent[3], 1.0)
    assert upper is not None and upper * 1.02 >= 1.0  # the last 12 rounds do not lose with confidence
    assert doubtful.allows(4, None) and 3 not in doubtful.held
    steady = [(1.0, 1.3), (1.1, 1.3)] * 6  # every round loses
    assert pooled_bound(guard_after(steady, 1.0).recent[3], 1.0) * 1.02 < 1.0
    assert not guard_after(steady, 1.0).allows(4, None)
    with pytest.raises(ValueError, match="hold_z"):
        ThroughputGuard(hold_z=-0.5)


def test_a_re_measuring_round_vouches_for_no_arm():
    """The first round of a held batch size's explored burst verifies up to a cap without the slowdown bound, which
    its arm does not otherwise run: neither the arm's rate nor the rate speculation is judged by takes it in."""
    cost = VerifyCostModel()
    cost.update(16, 0.100, rows=16)
    policy = GoodputVerifyLength(cost_model=cost, explore_every=4, max_explore_every=4, desync_per_row=0.0)
    policy.update(torch.zeros(16, dtype=torch.long), torch.ones(16, dtype=torch.long), 0.100)  # a plain step
    policy.guard.held[5] = deque(maxlen=policy.guard.resume_rounds)  # held
    while not policy.wants_drafts(16):  # plain steps until the hold explores
        policy.update(torch.zeros(16, dtype=torch.long), torch.ones(16, dtype=torch.long), 0.100)
    assert policy.guard.remeasuring
    policy.verify_lens(torch.full((16, 8), 0.9), None)
    policy.update(torch.full((16,), 4), torch.full((16,), 5, dtype=torch.long), 0.120)
    assert policy.rate(5, True) == pytest.approx(5 / 1.2)  # the guard saw it
    assert not any(b == 5 for b, _ in policy.bandit.capped) and policy.guard.own_rate(5) is None  # no arm, not as run


def test_an_explored_round_verifies_up_to_its_cap_whatever_the_cost_model_says():
    """While a bucket is held, the cost model's wider entries go stale (only plain steps run), so an explored round
    that let it choose could verify anchors only and prove nothing: the first round of an explored burst verifies
    every row's drafts up to the cap."""
    cost = VerifyCostModel()
    cost.update(4, 0.010, rows=4)
    cost.update(4 * 5, 0.200, rows=4)  # stale: verifying 4 drafts per row looks 20 plain steps dear,
    cost.update(4, 0.010)
    cost.update(20, 0.400)  # in a ragged forward too
    policy = GoodputVerifyLength(cost_model=cost, explore_every=4, min_evidence=1, explore_budget=1.0)
    rates = torch.full((4, 8), 0.6)
    policy.update(torch.zeros(4, dtype=torch.long), torch.ones(4, dtype=torch.long), 0.010, proposed=False)
    policy.update(
        torch.zeros(4, dtype=torch.long), torch.ones(4, dtype=torch.long), 0.020, proposed=True
    )  # a losing round
    assert policy.losing(3)
    lengths = []
    for _ in range(8):
        if policy.wants_drafts(4):
            chosen = policy.verify_lens(rates, None).tolist()
            if policy.guard.remeasuring:  # (the burst's other rounds run as resumed speculation would)
                lengths.append(chosen)
            policy.update(torch.full((4,), 2), torch.tensor(chosen), 0.020, proposed=True)
        else:
            assert int(policy.verify_lens(rates[:, :0], None).max()) == 1  # held: plain steps
            policy.update(torch.zeros(4, dtype=torch.long), torch.ones(4, dtype=torch.long), 0.010, proposed=False)
    assert lengths and all(max(row) >= 2 for row in lengths)  # the explored rounds verified drafts
    assert all(max(row) <= max(policy.caps) for row in lengths)
    from adaflash_hf.decoding.goodput import ragged_verify_lens

    assert int(ragged_verify_lens(rates, cost, None).max()) == 1  # what the stale cost model alone would have chosen


def test_a_fixed_length_arm_verifies_every_row_up_to_its_length_whatever_the_cost_model_says():
    """At 4 rows a cost table learnt from few, noisy ragged forwards made the goodput choice verify 10-74 % of the
    rows' anchors only, while adaflash@4 realised 1.16x plain (measured on a 2-core CPU): an arm of a fixed length
    runs as adaflash@N does, so the guard measures what that length realises and runs it where it pays most."""
    cost = VerifyCostModel()
    cost.update(4, 0.010, rows=4)
    for tokens, seconds in (
        (4, 0.010),
        (8, 0.150),
        (16, 0.200),
    ):  # drafts look dear: the goodput choice verifies anchors only
        cost.update(tokens, seconds, rows=4, ragged=True)
    rates = torch.full((4, 8), 0.5)
    from adaflash_hf.decoding.goodput import ragged_verify_lens

    assert ragged_verify_lens(rates, cost).tolist() == [1, 1, 1, 1]
    policy = GoodputVerifyLength(cost_model=cost, ragged=True, max_row_slowdown=None)  # the arms alone
    arms = {}
    for _ in range(12):  # the untried arms first: the goodput choice, then 4, then 2 (plain steps timed between)
        if not policy.wants_drafts(4):
            policy.update(torch.zeros(4, dtype=torch.long), torch.ones(4, dtype=torch.long), 0.010, proposed=False)
            continue
        lengths = policy.verify_lens(rates, None)
        arms.setdefault(policy._used_cap[1], lengths.tolist())
        policy.update(torch.ones(4, dtype=torch.long), lengths, 0.012, proposed=True)
    assert arms == {None: [1, 1, 1, 1], 4: [4, 4, 4, 4], 2: [2, 2, 2, 2]}
    assert policy.verify_lens(rates[:, :1], None).tolist() in ([1] * 4, [2] * 4)  # never past a row's proposal + 1


def test_the_guard_asks_larger_batches_to_win_by_more():
    """Speculative rounds that realise 8 % more than plain steps pay at 4 rows, not at 16, where desynchronised rows
    cost what no single round shows; a loss counts that cost too."""
    policy = GoodputVerifyLength()
    assert [round(policy.desync_cost(n.bit_length()), 3) for n in (1, 4, 8, 16, 32)] == [1.0, 1.024, 1.056, 1.12, 1.248]
    assert policy.desync_cost((12).bit_length()) == policy.desync_cost((8).bit_length())  # a bucket's smallest batch
    for rows, holds in ((4, False), (16, True)):
        cost = VerifyCostModel()
        cost.update(rows, 0.100, rows=rows)
        policy = GoodputVerifyLength(cost_model=cost, min_evidence=1)
        policy.update(torch.zeros(rows, dtype=torch.long), torch.ones(rows, dtype=torch.long), 0.100, proposed=False)
        policy.update(torch.ones(rows, dtype=torch.long), torch.full((rows,), 3), 0.100 * 2 / 1.08, proposed=True)
        assert policy.losing(rows.bit_length()) is holds
    lost = 2 / 1.08 * policy.desync_cost(5) - 2  # plain steps' worth: the round's time with its desync, less its tokens
    assert (
        policy.guard.explore[5]
        == max(policy.explore_every, math.ceil(policy.burst_rounds * lost / policy.explore_budget))
        == 23
    )


def test_the_guard_caps_verify_lengths_at_the_cap_that_realises_most():
    """Rounds under each cap realise what this table says; the policy ends up verifying at most 4 tokens per row
    (the cap that pays most here, though the cost model would verify 9) and still tries the others now and then."""
    cost = VerifyCostModel()
    cost.update(16, 0.100, rows=16)
    policy = GoodputVerifyLength(cost_model=cost, refresh_plain_every=1000)
    accepted = {None: [2] * 16, 4: [2] * 8 + [1] * 8, 2: [1] * 13 + [0] * 3}  # drafts accepted per row under each cap,
    steps = {None: 2.5, 4: 1.5, 2: 1.2}  # and the round's time in plain steps: 1.20, 1.67 and 1.51 tokens per step
    rates = torch.full((16, 8), 0.9)
    used = []
    for _ in range(200):
        if not policy.wants_drafts(16):
            policy.update(torch.zeros(16, dtype=torch.long), torch.ones(16, dtype=torch.long), 0.100, proposed=False)
            continue
        lengths = policy.verify_lens(rates, None)
        cap = policy._used_cap[1]
        assert cap is None or lengths.tolist() == [cap] * 16  # a fixed-length arm: every row verifies cap tokens
        used.append(cap)
        policy.update(torch.tensor(accepted[cap]), lengths, steps[cap] * 0.100, proposed=True)
    assert used[:3] == [None, 4, 2]  # every cap tried once first
    assert int(policy.verify_lens(rates[:1], None).max()) == 9  # one row: uncapped (the guard does not watch it)
    later = used[20:]
    assert later.count(4) > 0.8 * len(later) and {None, 2} <= set(later)  # the best, and the others explored
    assert later.count(None) < later.count(2)  # the clearly worse arm (0.72 of the best) less often than the close one
    assert policy.cap_rate(5, 4) > max(policy.cap_rate(5, None), policy.cap_rate(5, 2))
    with pytest.raises(ValueError, match="caps"):
        GoodputVerifyLength(caps=(1,))


def test_a_round_that_proposed_counts_as_speculative_even_when_it_verified_only_anchors():
    cost = VerifyCostModel()
    cost.update(16, 0.100, rows=16)
    policy = GoodputVerifyLength(cost_model=cost)
    anchors = torch.ones(16, dtype=torch.long)
    assert policy.wants_drafts(
        16
    )  # proposals made (the drafter ran), then every row chose a plain step: 1.2 steps' time
    policy.update(torch.zeros(16, dtype=torch.long), anchors, 0.120, proposed=True)
    assert policy.rate(5, True) == pytest.approx(1 / 1.2) and (5, False) not in policy.realised
    assert not policy.wants_drafts(16)  # time a real plain step next
    policy.update(torch.zeros(16, dtype=torch.long), anchors, 0.100, proposed=False)
    assert policy.rate(5, False) == pytest.approx(1.0) and policy.losing(5)
    assert not policy.wants_drafts(16)  # proposing costs more than it brings here: hold plain steps
    policy.update(torch.zeros(16, dtype=torch.long), anchors, 0.100, proposed=False)
    policy.update(
        torch.zeros(16, dtype=torch.long), torch.full((16,), 3), 0.2
    )  # proposed unknown: filed by verify lengths
    assert policy.guard.since[(5, True)] == 0


def test_report_round_passes_proposed_only_to_policies_that_take_it():
    from adaflash_hf.decoding.policy import report_round

    seen = []

    class Old:  # a user policy written against the three-argument update
        def update(self, accept_lengths, verify_lens, seconds):
            seen.append("old")

    class New:
        def update(self, accept_lengths, verify_lens, seconds, proposed=None):
            seen.append(proposed)

    report_round(Old(), torch.zeros(1), torch.ones(1), 0.1, True)
    report_round(New(), torch.zeros(1), torch.ones(1), 0.1, True)
    assert seen == ["old", True]


def test_slow_first_speculative_rounds_do_not_hold_plain_steps_for_long():
    cost = VerifyCostModel()
    cost.update(4, 0.010, rows=4)  # a plain step of 4 rows
    policy = GoodputVerifyLength(cost_model=cost, explore_every=8)
    one, spec, plain = (
        torch.ones(4, dtype=torch.long),
        torch.full((4,), 8, dtype=torch.long),
        torch.ones(4, dtype=torch.long),
    )
    for _ in range(4):  # warm-up: the first speculative rounds are ten times slower than they will be
        policy.update(one * 2, spec, 0.150)  # 3 tokens in 15 plain steps' time
    policy.update(one * 0, plain, 0.010)
    speculated = 0
    for _ in range(80):  # from now on a speculative round makes 3 tokens in 1.2 plain steps' time
        if policy.wants_drafts(4):
            speculated += 1
            policy.update(one * 2, spec, 0.012)
        else:
            policy.update(one * 0, plain, 0.010)
    assert policy.rate(3, True) > policy.rate(3, False) and speculated > 45  # recovered after a few explored rounds


def test_the_guard_times_a_plain_step_after_the_first_speculative_round_and_now_and_then():
    policy = GoodputVerifyLength(refresh_plain_every=3, burst_rounds=1)
    spec, plain = torch.full((2,), 3, dtype=torch.long), torch.ones(2, dtype=torch.long)
    answers = []
    for _ in range(6):
        answers.append(policy.wants_drafts(2))
        if answers[-1]:
            policy.update(torch.ones(2, dtype=torch.long), spec, 0.01)  # 2 tokens per row
        else:
            policy.update(torch.zeros(2, dtype=torch.long), plain, 0.01)  # 1 token per row, same time
    # no evidence: speculate; then time a plain step at this batch size at once; speculation wins, so it
    # goes on, with a plain step timed every refresh_plain_every rounds
    assert answers == [True, False, True, True, False, True]


@contextlib.contextmanager
def counting_forwards(module: torch.nn.Module):
    """A list that gets one entry per ``module.forward`` call made inside the block."""
    calls = []
    original = module.forward
    module.forward = lambda *a, **k: calls.append(1) or original(*a, **k)
    try:
        yield calls
    finally:
        del module.forward


def test_a_held_round_proposes_nothing_and_runs_no_drafter(target, drafter):
    class HoldPlain(FixedVerifyLength):
        def wants_drafts(self, rows):
            return False

    prompts = random_prompts((6, 9), seed=3)
    ids, mask = left_pad(prompts)
    with counting_forwards(drafter) as calls:
        out = generate(
            target,
            drafter,
            ids,
            mask,
            max_new_tokens=12,
            eos_token_id=None,
            drafting_state=DraftingState(),
            verify_policy=HoldPlain(),
        )
    assert not calls and out.mean_accepted_length == 1.0
    assert {s for r in out.stats.rounds for s in r.sources} == {"none"}
    want = [greedy_reference(target, p, 12, eos=False)[len(p) :] for p in prompts]
    assert [row[ids.shape[1] : ids.shape[1] + n] for row, n in zip(out.sequences.tolist(), out.num_new_tokens)] == want


def test_proposals_stop_at_what_the_round_can_verify_and_stay_lossless(target, drafter, tmp_path, monkeypatch):
    """Under a verify length of 3 (a fixed length, or an arm of the adaptive policy), no source proposes past 2 drafts:
    the look-ups follow their matches no further and the draft head scores no later block position."""
    prompts = random_prompts((3, 9, 5, 12), seed=11)
    ids, mask = left_pad(prompts)
    width = ids.shape[1]
    answers = [greedy_reference(target, p, 30, eos=False) for p in prompts]
    state = DraftingState()
    for answer in answers:  # long matches to follow: the same prompts, answered once
        state.remember(answer)
    longest, head_positions = [], []
    propose, top_probs = HybridProposer.propose, drafter_module.top_probs_and_tokens

    def recorded_propose(self, *args, **kwargs):
        proposal = propose(self, *args, **kwargs)
        longest.append(max((len(tokens) for options in proposal.candidates for _, tokens, _ in options), default=0))
        return proposal

    def recorded_top_probs(head, hidden):
        head_positions.append(hidden.shape[1])
        return top_probs(head, hidden)

    monkeypatch.setattr(HybridProposer, "propose", recorded_propose)
    monkeypatch.setattr(drafter_module, "top_probs_and_tokens", recorded_top_probs)
    out = generate(
        target,
        drafter,
        ids,
        mask,
        max_new_tokens=30,
        eos_token_id=None,
        drafting_state=state,
        drafting=DraftingConfig(drafter_every_round=True),
        verify_policy=FixedVerifyLength(3),
    )
    assert longest and max(longest) == 2 and head_positions and set(head_positions) == {2}
    assert max(n for r in out.stats.rounds for n in r.verify_lens) == 3
    want = [a[len(p) :] for a, p in zip(answers, prompts)]
    assert [row[width : width + n] for row, n in zip(out.sequences.tolist(), out.num_new_tokens)] == want
    policy = GoodputVerifyLength(caps=(3,))  # the adaptive policy's arm is known before the proposal, as a limit
    assert verify_limit(policy) is None
    policy._round_cap = 3
    assert verify_limit(policy) == 3 and verify_limit(FixedVerifyLength(5)) == 5 and verify_limit(object()) is None


@pytest.mark.parametrize("source", ["hybrid", "drafter", "suffix", "global", "datastore"])
def test_every_draft_source_is_lossless_in_fp32_greedy(target, drafter, source, tmp_path):
    """Ragged batch, loops in the tiny target's output (so suffix matches are found and accepted)."""
    prompts = random_prompts((3, 9, 5, 12), seed=11)
    ids, mask = left_pad(prompts)
    width = ids.shape[1]
    drafting = DraftingConfig() if source == "hybrid" else DraftingConfig.only(source)
    state = DraftingState()
    answers = [greedy_reference(target, p, 40, eos=False) for p in prompts]
    if source in ("global", "hybrid"):  # earlier requests of this process: the same prompts, answered once
        for answer in answers:
            state.remember(answer)
    if source in ("datastore", "hybrid"):  # the target's own outputs, shipped with the drafter
        save_datastore([a[len(p) :] for a, p in zip(answers, prompts)], tmp_path / "datastore.safetensors")
        drafter.adaflash_datastore = load_datastore(tmp_path / "datastore.safetensors")
    out = generate(
        target,
        None if source in ("suffix", "global") else drafter,
        ids,
        mask,
        max_new_tokens=40,
        eos_token_id=None,
        drafting=drafting,
        drafting_state=state,
        verify_policy=None if source == "hybrid" else FixedVerifyLength(),
    )  # fixed: no timing in the choices
    want = [greedy_reference(target, p, 40, eos=False)[len(p) :] for p in prompts]
    assert [row[width : width + n] for row, n in zip(out.sequences.tolist(), out.num_new_tokens)] == want
    used = {s for r in out.stats.rounds for s in r.sources}
    assert (
        used <= {"none", source} if source != "hybrid" else used <= {"none", "drafter", "suffix", "global", "datastore"}
    )
    if source in ("suffix", "global", "datastore"):
        assert out.stats.source_counts()[source][1] > 0  # its drafts were really accepted
        assert out.mean_accepted_length > 1.2


def test_engine_without_drafter_needs_a_suffix_source(target):
    ids = torch.tensor([random_prompts((5,))[0]])
    with pytest.raises(ValueError, match="no draft source"):
        generate(target, None, ids, max_new_tokens=4, drafting=DraftingConfig.only("drafter"))
    with pytest.raises(ValueError, match="enable at least one"):
        DraftingConfig(drafter=False, suffix=False, global_index=False, datastore=False)


def test_hybrid_learns_that_a_perfect_drafter_gets_accepted(target, drafter):
    """With a perfect drafter the hybrid keeps using it, and its rounds stay long."""
    prompts = random_prompts((6, 8), seed=4)
    ids, mask = left_pad(prompts)
    width = ids.shape[1]
    references = {width - len(p): greedy_reference(target, p, 60, eos=False) for p in prompts}
    oracle = OracleDrafter(drafter.config).setup(target, references, 0.0).eval()
    state = DraftingState()
    for _ in range(3):
        out = generate(
            target,
            oracle,
            ids,
            mask,
            max_new_tokens=40,
            eos_token_id=None,
            drafting_state=state,
            drafting=DraftingConfig(global_index=False),
            verify_policy=FixedVerifyLength(),
        )
        rounds, accepted = out.stats.source_counts()["drafter"]
        assert accepted / rounds > 3  # full blocks
        assert out.mean_accepted_length > 3
    assert state.estimator.rate("drafter", next(k[1] for k in state.estimator.seen if k[0] == "drafter")) > 0.8


def test_draft_vocabulary_restricts_drafts_saves_and_is_left_out_of_dflash_exports(target, drafter, tmp_path):
    vocab = torch.arange(4, 40)  # ids 0..3 and 40.. can never be drafted
    drafter.set_draft_vocab(vocab)
    head = DraftHead(target.get_output_embeddings(), drafter.draft_vocab)
    hidden = torch.randn(2, 3, target.config.hidden_size)
    assert head.logits(hidden).shape == (2, 3, len(vocab))
    assert set(head.to_target_ids(head.logits(hidden).argmax(-1)).flatten().tolist()) <= set(vocab.tolist())
    probs = head.to_target_probs(head.logits(hidden).softmax(-1), target.config.vocab_size)
    assert torch.allclose(probs.sum(-1), torch.ones(2, 3)) and probs[..., 40:].sum() == 0

    drafter.save_pretrained(tmp_path / "hf")
    loaded = AdaFlashDrafter.from_pretrained(tmp_path / "hf")
    assert loaded.config.draft_vocab_size == len(vocab) and torch.equal(loaded.draft_vocab, vocab)
    save_dflash_checkpoint(drafter, tmp_path / "dflash")
    exported = AdaFlashDrafter.from_pretrained(tmp_path / "dflash")
    assert exported.draft_vocab is None and exported.config.draft_vocab_size is None

    prompts = random_prompts((4, 7), seed=2)
    ids, mask = left_pad(prompts)
    out = generate(
        target, drafter, ids, mask, max_new_tokens=12, eos_token_id=None, drafting=DraftingConfig.only("drafter")
    )
    width = ids.shape[1]
    assert [row[width : width + n] for row, n in zip(out.sequences.tolist(), out.num_new_tokens)] == [
        greedy_reference(target, p, 12, eos=False)[len(p) :] for p in prompts
    ]
    drafter.set_draft_vocab(None)
    assert drafter.draft_vocab is None and "draft_vocab" not in drafter.state_dict()
    with pytest.raises(ValueError, match="distinct"):
        drafter.set_draft_vocab([5, 5])
    with pytest.raises(ValueError, match="vocab_size"):
        drafter.set_draft_vocab([5, 10_000])


def test_draft_vocabulary_from_counts_covers_what_it_counted():
    seqs = [TrainingSequence(torch.tensor([1, 1, 7, 7, 7, 9, 3]), start=2)]  # responses: 7 7 7 9 3
    counts = response_token_counts(seqs)
    assert counts == {7: 3, 9: 1, 3: 1}
    vocab = most_frequent(counts, 2, vocab_size=20, always=[3])
    assert vocab.tolist() == [3, 7]  # EOS always in, then the most frequent
    assert coverage(vocab, counts) == pytest.approx(4 / 5)
    assert most_frequent(counts, 5, vocab_size=20).tolist() == [0, 1, 3, 7, 9]  # unseen ids fill up
    assert coverage(most_frequent(counts, 20, vocab_size=20), counts) == 1.0


def test_a_corrupt_datastore_gets_a_clear_error(tmp_path):
    bad = tmp_path / "datastore.safetensors"
    bad.write_bytes(b"not a safetensors file")
    with pytest.raises(OSError, match="cannot be read.*prepare-drafter"):
        load_datastore(bad)
    save_datastore([[1, 2, 3]], bad)
    assert load_datastore(bad).num_tokens == 3


def test_forget_requests_empties_the_global_index_and_keeps_what_was_measured():
    state = DraftingState()
    state.remember([5, 6, 7, 8, 9, 5, 6, 7])
    state.cost_model.update(4, 0.01)
    assert state.global_index.num_tokens > 0
    state.forget_requests()
    assert state.global_index.num_tokens == 0 and state.cost_model.seconds  # costs stay measured


def test_the_drafter_scores_candidate_tokens_with_its_own_probabilities(target):
    vocab = torch.arange(4, 40)
    head = DraftHead(target.get_output_embeddings(), vocab)
    logits = torch.randn(2, 3, len(vocab))
    score = head.scorer(logits)
    probs = logits.softmax(-1)
    tokens = [5, 39, 2, 7, 8]  # 2 is outside the draft vocabulary; positions past the block (3) have no opinion
    got, other = score([(1, tokens), (0, [39])])  # one gather answers every query of a round
    assert got[3:] == [None, None] and got[2] == 0.0
    assert got[0] == pytest.approx(float(probs[1, 0, 1])) and got[1] == pytest.approx(float(probs[1, 1, 35]))
    assert other[0] == pytest.approx(float(probs[0, 0, 35]))
    assert score([(0, [])]) == [[]] and score([]) == []
    assert [drafter_bucket(p) for p in (None, 0.001, 0.05, 0.2, 0.9)] == ["q-", "q0", "q1", "q2", "q3"]


class StubDrafter:
    """A drafter of block size 4 whose block is always [3, 1, 9]; ``calls`` counts its passes."""

    block_size = 4

    def __init__(self, calls, scorer):
        self.calls, self.scorer = calls, scorer

    def propose(self, row_ids, anchors, anchor_pos, max_len):
        self.calls.append(1)
        return DrafterBlock(torch.tensor([[3, 1, 9]]), torch.tensor([[0.9, 0.8, 0.1]]), self.scorer)


@pytest.mark.parametrize("cheap", [True, False])
def test_a_cheap_drafter_runs_every_round_and_scores_the_look_up_candidates(cheap):
    state = DraftingState()
    state.observe_round(1, 0.040, 0.002 if cheap else 0.020)  # a drafter pass costs 5 % or 50 % of a step
    state.drafter_value = 0.0
    calls = []
    drafter = StubDrafter(calls, lambda queries: [[0.6] * len(t) for _, t in queries])
    proposer = HybridProposer(state, DraftingConfig(global_index=False), drafter)
    proposer.add_row(0, [1, 2, 3, 1, 2, 3, 1, 2])
    state.rounds_since_drafter = -100  # drafter_pays alone would skip it: the suffix candidate is worth more

    proposal = proposer.propose([0], tree=True, max_depths=[8])
    suffix_features = [f for source, _, features in proposal.candidates[0] if source == "suffix" for f in features]
    assert suffix_features
    if cheap:
        assert calls and all(f[-1] == "q3" for f in suffix_features)
        assert any(source == "drafter" for source, _, _ in proposal.candidates[0])  # its block joins the tree too
    else:
        assert not calls and not any(isinstance(f[-1], str) for f in suffix_features)


def test_the_drafters_cost_is_measured_per_batch_size():
    """A pass over 16 rows costs several one-row passes: cheap enough to score look-ups at batch 1 is not cheap at
    16."""
    state = DraftingState()
    assert state.drafter_cost(1) is None and not state.drafter_is_cheap(1)
    state.observe_round(1, 0.040, 0.002)  # one row: the drafter costs 5 % of a plain step
    state.observe_round(16, 0.080, 0.030, rows=16)  # sixteen rows: 37 % of a plain step of sixteen rows
    assert state.drafter_cost(1) == pytest.approx(0.002) and state.drafter_cost(16) == pytest.approx(0.030)
    assert state.drafter_cost(1) < state.drafter_cost(8) < state.drafter_cost(16)  # interpolated between
    assert state.drafter_is_cheap(1) and not state.drafter_is_cheap(16)
    state.drafter_value = 1.0  # its blocks get one draft accepted; the look-ups offer nothing
    assert state.drafter_pays([0.0], width=4)
    assert not state.drafter_pays([0.9] * 16, width=4)  # at sixteen rows a pass costs more than it adds
    state.observe_round(16, 0.080, 0.001, rows=16)  # a faster pass lowers the estimate, and the table stays monotone
    assert state.drafter_cost(1) <= state.drafter_cost(16)


@pytest.mark.parametrize("every_round", [False, True])
def test_a_drafter_that_does_not_pay_is_skipped_unless_it_must_draft_every_round(every_round):
    state = DraftingState()
    state.observe_round(1, 0.040, 0.020)  # half a step for nothing accepted
    state.drafter_value = 0.0
    calls = []
    proposer = HybridProposer(
        state,
        DraftingConfig(
            suffix=False, global_index=False, datastore=False, drafter_scores=False, drafter_every_round=every_round
        ),
        StubDrafter(calls, None),
    )
    proposer.add_row(0, [1, 2, 3])

    proposal = proposer.propose([0])
    assert len(calls) == int(every_round)
    assert proposal.sources == (["drafter"] if every_round else ["none"])


def test_drafting_every_round_runs_the_drafter_once_per_round_and_stays_lossless(target, drafter):
    prompts = random_prompts((6, 9), seed=4)
    ids, mask = left_pad(prompts)
    with counting_forwards(drafter) as calls:
        out = generate(
            target,
            drafter,
            ids,
            mask,
            max_new_tokens=16,
            eos_token_id=None,
            verify_policy=FixedVerifyLength(None),
            drafting=DraftingConfig(suffix=False, global_index=False, datastore=False, drafter_every_round=True),
            drafting_state=DraftingState(),
        )
    assert len(calls) == len(out.stats.rounds)
    want = [greedy_reference(target, p, 16, eos=False)[len(p) :] for p in prompts]
    assert [row[ids.shape[1] : ids.shape[1] + n] for row, n in zip(out.sequences.tolist(), out.num_new_tokens)] == want


def test_scored_hybrid_rounds_stay_lossless_in_fp32_greedy(target, drafter, monkeypatch):
    monkeypatch.setattr(DraftingState, "SCORE_COST", 1e9)  # the drafter always counts as cheap: every round is scored
    prompts = random_prompts((3, 9, 5, 12), seed=11)
    ids, mask = left_pad(prompts)
    state = DraftingState()
    out = generate(target, drafter, ids, mask, max_new_tokens=30, eos_token_id=None, drafting_state=state)
    want = [greedy_reference(target, p, 30, eos=False)[len(p) :] for p in prompts]
    assert [row[ids.shape[1] : ids.shape[1] + n] for row, n in zip(out.sequences.tolist(), out.num_new_tokens)] == want
    assert any(isinstance(feature[-1], str) for source, feature in state.estimator.seen if source != "drafter")


def test_an_exported_acceptance_prior_seeds_a_fresh_estimator_capped(tmp_path):
    import json

    trained = AcceptanceEstimator()
    trained.update("suffix", [(0, 4, 3, True), (1, 4, 3, True)], 2, 1)
    for _ in range(99):
        trained.update("datastore", [(0, 2, 1, False, 1)], 1, 0)
    path = tmp_path / PRIOR_FILE
    path.write_text(json.dumps(trained.export()))
    fresh = AcceptanceEstimator()
    fresh.seed(load_acceptance_prior(path), cap=16)
    feature = (0, 4, 3, True)
    assert fresh.rate("suffix", feature) == pytest.approx(
        trained.rate("suffix", feature)
    )  # under the cap: the same counts
    assert fresh.seen[("datastore", (0, 2, 1, False, 1))] == 16 and fresh.rate("datastore", (0, 2, 1, False, 1)) < 0.05
    state = DraftingState()
    state.seed_acceptance(load_acceptance_prior(path))
    state.seed_acceptance(load_acceptance_prior(path))  # once per state
    assert state.estimator.seen[("suffix", feature)] == 1


@pytest.mark.parametrize(
    "content, reason",
    [
        ("not json", "cannot be read"),
        ('{"format": "other"}', "format"),
        ('{"format": "adaflash-acceptance-prior", "entries": [["suffix", [0], 3, 1]]}', "hits <= seen"),
        ('{"format": "adaflash-acceptance-prior", "entries": [["nope", [0], 0, 1]]}', "source"),
    ],
)
def test_a_corrupt_acceptance_prior_gets_a_clear_error(tmp_path, content, reason):
    path = tmp_path / PRIOR_FILE
    path.write_text(content)
    with pytest.raises(OSError, match="acceptance-prompts") as error:
        load_acceptance_prior(path)
    assert str(path) in str(error.value) and (reason in str(error.value) or reason == "cannot be read")


def test_load_drafter_attaches_the_prior_and_the_engine_starts_from_it(target, drafter, tmp_path):
    import json

    from adaflash_hf import load_drafter

    drafter.save_pretrained(tmp_path / "d")
    prior = AcceptanceEstimator()
    prior.update("suffix", [(0, 1, 1, True)], 1, 1)
    (tmp_path / "d" / PRIOR_FILE).write_text(json.dumps(prior.export()))
    loaded = load_drafter(str(tmp_path / "d"), target)
    assert loaded.adaflash_acceptance_prior["entries"]
    state = DraftingState()
    generate(
        target,
        loaded,
        torch.tensor([random_prompts((5,))[0]]),
        max_new_tokens=2,
        eos_token_id=None,
        drafting_state=state,
    )
    assert state.seeded and ("suffix", (0, 1, 1, True)) in state.estimator.seen


def test_the_proposal_overhead_is_a_proposing_rounds_extra_time_over_a_plain_steps():
    state = DraftingState()
    state.observe_extra(4, True, 0.006)
    assert state.proposal_overhead(4) is None  # no plain step measured to compare with
    state.observe_extra(4, False, 0.001)
    assert state.proposal_overhead(4) == pytest.approx(0.005)
    state.observe_extra(16, True, 0.020)
    state.observe_extra(16, False, 0.002)
    assert state.proposal_overhead(4) < state.proposal_overhead(8) < state.proposal_overhead(16)  # interpolated
    state.observe_extra(4, True, 0.001)  # a moving average: one cheap round moves the estimate a fifth of the way
    assert state.proposal_overhead(4) == pytest.approx(0.8 * 0.006 + 0.2 * 0.001 - 0.001)
    fresh = DraftingState()
    fresh.observe_extra(2, True, 0.001)
    fresh.observe_extra(2, False, 0.003)  # plain steps that happened to cost more
    assert fresh.proposal_overhead(2) == 0.0  # never negative
