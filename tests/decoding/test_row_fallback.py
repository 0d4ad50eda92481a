"""Rows whose drafts are rarely accepted fall back to plain first (RowTrust), no row runs slower than plain by more
than the slowdown bound, and the guard's tail check holds a batch size where speculation pays on average but slows
the rows it helps least."""

from __future__ import annotations

import pytest
import torch

from adaflash_hf import GoodputVerifyLength
from adaflash_hf.decoding.acceptance import expected_accepted
from adaflash_hf.decoding.cost import VerifyCostModel
from adaflash_hf.decoding.policy import choose_verify_lens, report_round
from adaflash_hf.decoding.row_trust import RowTrust
from adaflash_hf.decoding.throughput_guard import ThroughputGuard


def test_trust_scales_each_rows_expected_accepted_length_by_its_factor():
    trust = RowTrust(prior_weight=2.0, decay=1.0)
    rates = torch.tensor([[0.8, 0.6, 0.5], [0.8, 0.6, 0.5]])
    for _ in range(10):  # row "b" verifies three drafts a round (2.128 expected) and gets none accepted
        trust.update(["a", "b"], rates, [3, 3], [3, 0])
    assert trust.trust("a") == 1.0  # at most 1: a row never gets more than the estimates promise
    assert trust.trust("b") == pytest.approx(2.0 / (10 * expected_accepted([0.8, 0.6, 0.5]) + 2.0))
    scaled = trust.scale(["a", "b"], rates)
    assert torch.equal(rates, torch.tensor([[0.8, 0.6, 0.5], [0.8, 0.6, 0.5]]))  # the input is left as it was
    for i, row in enumerate(["a", "b"]):  # every term of sum_k prod_{j<=k} a_j carries a_1: the whole sum scales
        promised = expected_accepted([0.8, 0.6, 0.5])
        assert expected_accepted(scaled[i].tolist()) == pytest.approx(trust.trust(row) * promised)
    assert trust.trust("new") == 1.0 and torch.equal(trust.scale(["new"], rates[:1]), rates[:1])


def test_trust_forgets_old_evidence_and_stays_bounded():
    trust = RowTrust(decay=0.8, max_rows=3)
    rates = torch.full((1, 2), 0.9)
    for _ in range(20):
        trust.update(["r"], rates, [2], [0])
    low = trust.trust("r")
    for _ in range(20):  # the request turns easy: its last rounds decide
        trust.update(["r"], rates, [2], [2])
    assert low < 0.3 and trust.trust("r") == 1.0
    trust.update(["r"], rates, [0], [0])  # a plain step is no evidence
    for row in "abcd":
        trust.update([row], rates, [1], [0])
    assert len(trust.sums) == 3 and "r" not in trust.sums
    trust.forget(["d"])
    assert "d" not in trust.sums
    with pytest.raises(ValueError, match="prior_weight"):
        RowTrust(prior_weight=0)


def _two_row_policy(**kwargs) -> GoodputVerifyLength:
    cost = VerifyCostModel()
    for total, seconds in ((2, 0.010), (4, 0.011), (10, 0.013)):
        cost.update(total, seconds, rows=2, ragged=True)
    cost.update(2, 0.010, rows=2)
    return GoodputVerifyLength(cost_model=cost, ragged=True, **kwargs)


def test_a_row_whose_drafts_keep_failing_verifies_only_its_anchor_while_the_other_keeps_drafting():
    policy = _two_row_policy(caps=(), max_row_slowdown=None)  # trust alone (the bound would also trim the good row)
    rates = torch.full((2, 4), 0.7)
    assert choose_verify_lens(policy, rates, None, None, ["good", "bad"]).tolist() == [5, 5]  # same estimates
    for _ in range(12):
        lengths = choose_verify_lens(policy, rates, None, None, ["good", "bad"])
        report_round(policy, torch.tensor([4, 0]) * (lengths > 1), lengths, 0.02, True, ["good", "bad"])
    lengths = choose_verify_lens(policy, rates, None, None, ["good", "bad"])
    assert lengths[0] == 5 and lengths[1] <= 2  # the failing row's drafts went first, down to its likeliest one
    assert policy.trust.trust("bad") < 0.2 and policy.trust.trust("good") == 1.0
    # the same rows without their ids (a caller that does not pass them): no per-row judgement
    assert policy.verify_lens(rates, None, None).tolist() == [5, 5]
    # alone, a row's drafts delay no one: its trust does not cut them
    assert policy.verify_lens(rates[1:], None, None, rows=["bad"]).tolist() == [5]
    assert GoodputVerifyLength(cost_model=policy.cost_model, row_trust=False).verify_lens(
        rates, None, None, rows=["good", "bad"]
    ).tolist() == [5, 5]


def test_a_fixed_length_arm_leaves_out_rows_whose_first_draft_is_hardly_ever_accepted():
    policy = _two_row_policy(caps=(3,), max_row_slowdown=None)  # the arm alone
    policy.trust.sums["bad"] = [0.0, 40.0]  # trust 2 / 42
    policy._round_cap = 3
    lengths = policy.verify_lens(torch.full((2, 4), 0.7), None, None, rows=["good", "bad"])
    assert lengths.tolist() == [3, 1]


def _tail_guard(**kwargs) -> ThroughputGuard:
    kwargs.setdefault("tail_tolerance", 1.05)
    guard = ThroughputGuard(desync_per_row=0.0, min_evidence=1, burst_rounds=1, **kwargs)
    guard.record(5, False, 1.0, 1.0, None)  # plain: one token per row per plain step
    return guard


def test_the_tail_check_holds_a_batch_size_where_speculation_slows_the_rows_it_helps_least():
    rows = [f"r{i}" for i in range(16)]
    # rounds cost 1.3 plain steps; 12 rows gain 2.6 tokens, 4 rows 1 token: 2.2 tokens per row on average
    tokens = [2.6] * 12 + [1.0] * 4
    guard = _tail_guard(tail_quantile=0.1)
    for _ in range(8):
        guard.record(5, True, sum(tokens) / 16, 1.3, None)
        guard.record_rows(5, rows, tokens, 1.3)
    assert guard.rate(5, True) > 1.5 * guard.rate(5, False)  # on average speculation wins by far
    assert guard.tail_rate(5) == pytest.approx(1 / 1.3)  # but its worst rows get 0.77 tokens per plain step
    assert guard.losing(5, None) and not guard.allows(16, None)
    # the same batch where every row gains: speculation goes on
    even = _tail_guard()
    for _ in range(8):
        even.record(5, True, 2.2, 1.3, None)
        even.record_rows(5, rows, [2.2] * 16, 1.3)
    assert not even.losing(5, None) and even.allows(16, None)
    # a tolerance as wide as the tail's loss lets it through; too little evidence decides nothing
    lenient = _tail_guard(tail_tolerance=1.31)
    for _ in range(8):
        lenient.record(5, True, sum(tokens) / 16, 1.3, None)
        lenient.record_rows(5, rows, tokens, 1.3)
    assert not lenient.losing(5, None)
    sparse = _tail_guard()
    sparse.record(5, True, 2.2, 1.3, None)
    sparse.record_rows(5, rows, tokens, 1.3)  # one round per row: below tail_min_rounds
    assert sparse.tail_rate(5) is None and not sparse.losing(5, None)
    off = _tail_guard(tail_tolerance=None)  # the default: no tail check, no per-row bookkeeping
    for _ in range(8):
        off.record(5, True, sum(tokens) / 16, 1.3, None)
        off.record_rows(5, rows, tokens, 1.3)
    assert not off.losing(5, None) and not off.row_realised


def test_the_tail_check_remembers_a_bounded_number_of_rows():
    guard = _tail_guard(tail_rows=8)
    for i in range(100):
        guard.record_rows(5, [i, i + 1], [1.0, 2.0], 1.0)
    assert len(guard.row_realised[5]) == 8
    with pytest.raises(ValueError, match="tail_quantile"):
        ThroughputGuard(tail_quantile=2.0)


def test_the_engine_passes_row_ids_to_policies_that_take_them():
    seen = []

    class Rows:
        def verify_lens(self, rates, draft_hidden_states, sources=None, rows=None):
            seen.append(("choose", rows))
            return torch.ones(rates.shape[0], dtype=torch.long)

        def update(self, accept_lengths, verify_lens, seconds, proposed=None, rows=None):
            seen.append(("update", rows))

    class Old:
        def verify_lens(self, rates, draft_hidden_states, sources=None):
            seen.append("old")
            return torch.ones(rates.shape[0], dtype=torch.long)

    choose_verify_lens(Rows(), torch.zeros(2, 3), None, None, ["x", "y"])
    report_round(Rows(), torch.zeros(2), torch.ones(2), 0.1, True, ["x", "y"])
    choose_verify_lens(Old(), torch.zeros(2, 3), None, None, ["x", "y"])
    assert seen == [("choose", ["x", "y"]), ("update", ["x", "y"]), "old"]


def _linear_cost(rows: int, per_token: float = 0.01, base: float = 0.1) -> VerifyCostModel:
    """A ragged cost table at ``rows`` rows: base seconds plus per_token per new token (a plain step: rows tokens)."""
    cost = VerifyCostModel()
    for tokens in (rows, 4 * rows, 8 * rows):
        cost.update(tokens, base + per_token * tokens, rows=rows, ragged=True)
    return cost


def _slowdown(lengths, rates, cost, overhead=0.0) -> float:
    """(overhead + cost of the round) / cost of a plain step / the least-served row's expected tokens."""
    rows = len(lengths)
    gains = rates.cumprod(-1)
    expected = torch.tensor([1 + float(gains[i, : int(n) - 1].sum()) for i, n in enumerate(lengths)])
    total = int(sum(int(n) for n in lengths))
    return (overhead + cost.cost_ragged(rows, total)) / cost.cost_ragged(rows, rows) / float(expected.min())


def test_the_slowdown_bound_keeps_every_row_within_it_dropping_the_least_likely_drafts_first():
    from adaflash_hf.decoding.goodput import ragged_verify_lens, within_slowdown

    cost = _linear_cost(4, per_token=0.001)
    rates = torch.tensor([[0.9] * 6, [0.8] * 6, [0.7] * 6, [0.05] * 6])  # row 3's drafts are hopeless
    chosen = torch.tensor([7, 7, 7, 2])
    assert _slowdown(chosen, rates, cost) > 1.05  # row 3 gains 1.05 tokens from a round 1.5x a plain step
    bounded = within_slowdown(chosen, rates, cost, 1.05)
    assert _slowdown(bounded, rates, cost) <= 1.05
    assert (bounded <= chosen).all() and bounded.sum() > 4  # trimmed, not switched off
    # the most drafts that meet the bound: adding back the likeliest dropped draft breaks it
    gains = rates.cumprod(-1)
    dropped = [(float(gains[i, int(bounded[i]) - 1]), i) for i in range(4) if bounded[i] < chosen[i]]
    _, row = max(dropped)
    wider = bounded.clone()
    wider[row] += 1
    assert _slowdown(wider, rates, cost) > 1.05
    # rows that all gain clear the bound untouched; a round whose proposal alone broke it keeps the fewest drafts
    # that come closest (more drafts for the least-served row lower its slowdown)
    good = torch.tensor([[0.9] * 6] * 4)
    assert within_slowdown(ragged_verify_lens(good, cost), good, cost, 1.05).equal(ragged_verify_lens(good, cost))
    closest = within_slowdown(chosen, rates, cost, 1.05, overhead=1.0)
    assert _slowdown(closest, rates, cost, 1.0) == pytest.approx(
        min(_slowdown(torch.tensor(c), rates, cost, 1.0) for c in ([1, 1, 1, 1], closest.tolist()))
    )
    single = within_slowdown(torch.tensor([7]), rates[:1], cost, 1.05)  # one row delays no one
    assert single.tolist() == [7]


def test_the_policy_bounds_each_rows_slowdown_in_batches_and_counts_the_drafters_pass():
    cost = _linear_cost(4, per_token=0.001)
    rates = torch.tensor([[0.9] * 6, [0.8] * 6, [0.7] * 6, [0.05] * 6])
    bounded = GoodputVerifyLength(cost_model=cost, ragged=True, caps=(), max_row_slowdown=1.05, slowdown_min_rows=2)
    free = GoodputVerifyLength(cost_model=cost, ragged=True, caps=(), max_row_slowdown=None)
    unbounded = free.verify_lens(rates, None)
    assert _slowdown(unbounded, rates, cost) > 1.05  # the goodput choice alone serves row 3 badly
    lengths = bounded.verify_lens(rates, None)
    assert _slowdown(lengths, rates, cost) <= 1.05 and lengths.sum() < unbounded.sum()
    larger_only = GoodputVerifyLength(cost_model=cost, ragged=True, caps=(), max_row_slowdown=1.05)
    assert larger_only.slowdown_min_rows > 4 and larger_only.verify_lens(rates, None).equal(unbounded)
    # a drafter pass that costs half a plain step leaves room for fewer drafts
    bounded.drafter_cost = lambda rows: 0.5 * cost.cost_ragged(rows, rows)
    with_drafter = bounded.verify_lens(rates, torch.zeros(4, 6, 8))  # the drafter proposed this round
    assert with_drafter.sum() <= lengths.sum()
    assert bounded.verify_lens(rates, None).equal(lengths)  # look-ups only: no drafter pass to count


def test_by_default_no_bound_empties_a_round_whose_drafter_pass_is_already_paid_for():
    """With a dear drafter pass the bound cannot be met; it then keeps the fewest drafts, often none, so the round
    pays for its proposals and gains nothing. Off by default, the goodput choice stands."""
    from adaflash_hf.decoding.goodput import ragged_verify_lens

    cost = _linear_cost(4, per_token=0.002)
    rates = torch.tensor([[0.9] * 6, [0.8] * 6, [0.7] * 6, [0.15] * 6])  # row 3 gains one token: the bound's limit
    dear = lambda rows: 0.5 * cost.cost_ragged(rows, rows)  # noqa: E731 (the drafter's pass: half a plain step)
    default = GoodputVerifyLength(cost_model=cost, ragged=True, caps=())
    bounded = GoodputVerifyLength(cost_model=cost, ragged=True, caps=(), max_row_slowdown=1.05, slowdown_min_rows=2)
    default.drafter_cost = bounded.drafter_cost = dear
    drafted = torch.zeros(4, 6, 8)  # the drafter proposed this round
    assert default.max_row_slowdown is None
    chosen = default.verify_lens(rates, drafted)
    assert chosen.equal(ragged_verify_lens(rates, cost)) and chosen.sum() > 4
    assert bounded.verify_lens(rates, drafted).tolist() == [1, 1, 1, 1]


def test_the_slowdown_bound_counts_what_look_ups_and_the_tree_cost():
    cost = _linear_cost(4, per_token=0.001)
    rates = torch.tensor([[0.9] * 6, [0.8] * 6, [0.7] * 6, [0.05] * 6])
    bounded = GoodputVerifyLength(cost_model=cost, ragged=True, caps=(), max_row_slowdown=1.05, slowdown_min_rows=2)
    lengths = bounded.verify_lens(rates, None)
    assert lengths.sum() > 4  # some drafts fit the bound with the forward priced alone
    overhead = 0.03 * cost.cost_ragged(4, 4)  # look-ups and the tree at 3 % of a plain step
    assert _slowdown(lengths, rates, cost, overhead) > 1.05  # the lengths chosen without it break the bound
    bounded.proposal_overhead = lambda rows: overhead
    dear = bounded.verify_lens(rates, None)
    assert dear.sum() < lengths.sum() and _slowdown(dear, rates, cost, overhead) <= 1.05
    bounded.proposal_overhead = lambda rows: None  # not measured yet: the forward alone, as before
    assert bounded.verify_lens(rates, None).equal(lengths)


def test_a_row_ahead_of_plain_pace_spends_its_lead_instead_of_holding_back_the_batch():
    from adaflash_hf.decoding.goodput import within_slowdown

    cost = _linear_cost(4, per_token=0.001)
    rates = torch.tensor([[0.9] * 6, [0.8] * 6, [0.7] * 6, [0.05] * 6])  # row 3 gains little from any round
    chosen = torch.tensor([7, 7, 7, 2])
    plain_pace = within_slowdown(chosen, rates, cost, 1.05)
    assert within_slowdown(chosen, rates, cost, 1.05, slack=torch.zeros(4)).equal(plain_pace)
    assert within_slowdown(chosen, rates, cost, 1.05, slack=torch.tensor([0.0, 0.0, 0.0, -3.0])).equal(plain_pace)
    # row 3 is 5 tokens ahead: the round's 0.5 plain steps beyond its gain come out of its lead
    assert within_slowdown(chosen, rates, cost, 1.05, slack=torch.tensor([0.0, 0.0, 0.0, 5.0])).equal(chosen)
    # a lead on the rows the round serves well changes nothing: row 3 is at plain pace and sets the bound
    assert within_slowdown(chosen, rates, cost, 1.05, slack=torch.tensor([5.0, 5.0, 5.0, 0.0])).equal(plain_pace)
    # a small lead buys part of the way: never fewer drafts than at plain pace
    part = within_slowdown(chosen, rates, cost, 1.05, slack=torch.tensor([0.0, 0.0, 0.0, 0.2]))
    assert (plain_pace <= part).all() and (part <= chosen).all()


def test_row_pace_counts_tokens_gained_against_plain_steps_spent():
    from adaflash_hf.decoding.row_trust import RowPace

    pace = RowPace(max_rows=2)
    pace.update(["a", "b"], [3, 1], steps=1.25)  # a: +1.75, b: -0.25
    pace.update(["a", "b"], [1, 1], steps=1.0)  # a plain step changes nothing
    assert pace.slack(["a", "b", "new"]).tolist() == pytest.approx([1.75, 0.0, 0.0])
    pace.update(["c"], [2], steps=1.0)  # bounded: the least recently updated row is forgotten
    assert set(pace.ahead) == {"b", "c"}
    with pytest.raises(ValueError, match="max_rows"):
        RowPace(max_rows=0)


def test_the_policy_lets_rows_ahead_of_plain_pace_keep_drafting_under_the_bound():
    cost = _linear_cost(4, per_token=0.001)
    rates = torch.tensor([[0.9] * 6, [0.8] * 6, [0.7] * 6, [0.05] * 6])
    rows = ["r0", "r1", "r2", "r3"]
    kwargs = dict(cost_model=cost, ragged=True, caps=(), max_row_slowdown=1.05, slowdown_min_rows=4, row_trust=False)
    with_slack, without = GoodputVerifyLength(**kwargs), GoodputVerifyLength(**kwargs, row_slack=False)
    for policy in (with_slack, without):  # earlier rounds took row 3 six tokens ahead of plain pace
        policy.update(torch.tensor([0, 0, 0, 6]), torch.tensor([7, 7, 7, 7]), 0.004, proposed=True, rows=rows)
    assert with_slack.pace.slack(rows)[3] > 5
    at_pace = without.verify_lens(rates, None, rows=rows)
    assert _slowdown(at_pace, rates, cost) <= 1.05
    assert with_slack.verify_lens(rates, None, rows=rows).sum() > at_pace.sum()
