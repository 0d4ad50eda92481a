"""The `evaluate` metric in metrics/adaflash_speculative: its identities, and agreement with the library's own
counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adaflash_hf.decoding.outputs import RoundStats, SpeculativeStats

evaluate = pytest.importorskip("evaluate", reason="the metric module needs `evaluate` (pip install 'adaflash-hf[dev]')")

ROOT = Path(__file__).resolve().parents[1]
METRIC = ROOT / "metrics" / "adaflash_speculative"


@pytest.fixture(scope="module")
def metric():
    return evaluate.load(str(METRIC))  # a local folder: no network


def _inputs(accept_lengths, verify_lens=None, spec_rates=None, plain_rates=None, spec_ids=None, plain_ids=None):
    n = len(accept_lengths)
    ids = [[1, 2, 3]] * n
    return dict(
        accept_lengths=accept_lengths,
        verify_lens=verify_lens or [[8] * len(a) for a in accept_lengths],
        spec_tokens_per_second=spec_rates or [10.0] * n,
        plain_tokens_per_second=plain_rates or [10.0] * n,
        spec_ids=spec_ids or ids,
        plain_ids=plain_ids or ids,
    )


def test_worked_example_of_the_readme(metric):
    scores = metric.compute(
        accept_lengths=[[2, 0, 1]],
        verify_lens=[[4, 4, 4]],
        spec_tokens_per_second=[30.0],
        plain_tokens_per_second=[20.0],
        spec_ids=[[5, 6, 7, 8, 9, 10]],
        plain_ids=[[5, 6, 7, 8, 9, 10]],
    )
    assert scores == pytest.approx({"tau": 2.0, "accept_rate": 1 / 3, "speedup": 1.5, "exact_match": 1.0})


def test_tau_of_all_zero_accepts_is_one(metric):
    scores = metric.compute(**_inputs([[0, 0, 0], [0]], verify_lens=[[4, 4, 4], [2]]))
    assert scores["tau"] == 1.0 and scores["accept_rate"] == 0.0


def test_accept_rate_is_undefined_without_verified_drafts(metric):
    scores = metric.compute(**_inputs([[0, 0]], verify_lens=[[1, 1]]))  # plain steps: anchor only
    assert scores["tau"] == 1.0 and scores["accept_rate"] is None


def test_exact_match_of_identical_lists_is_one_and_one_token_lowers_it(metric):
    same = [[5, 6, 7], [8, 9]]
    assert metric.compute(**_inputs([[0], [0]], spec_ids=same, plain_ids=same))["exact_match"] == 1.0
    one_off = metric.compute(**_inputs([[0], [0]], spec_ids=[[5, 6, 7], [8, 4]], plain_ids=same))["exact_match"]
    assert one_off == 0.5
    shorter = metric.compute(**_inputs([[0]], spec_ids=[[5, 6]], plain_ids=[[5, 6, 7]]))["exact_match"]
    assert shorter == 0.0


def test_speedup_of_equal_rates_is_one_and_pools_tokens_over_seconds(metric):
    rates = [7.0, 31.0, 12.5]
    ids = [[1] * 10, [2] * 30, [3] * 5]
    assert metric.compute(**_inputs([[0]] * 3, spec_rates=rates, plain_rates=rates, spec_ids=ids, plain_ids=ids))[
        "speedup"
    ] == pytest.approx(1.0)
    # 10 tokens at 10 tok/s and 30 at 60 tok/s (1.5 s in all) against 40 tokens at 10 tok/s: a pooled 2.67x;
    # the mean of the per-generation ratios would be 3.5x.
    ids = [[1] * 10, [2] * 30]
    speedup = metric.compute(
        **_inputs([[0], [0]], spec_rates=[10.0, 60.0], plain_rates=[10.0, 10.0], spec_ids=ids, plain_ids=ids)
    )["speedup"]
    assert speedup == pytest.approx((40 / 1.5) / 10)


def test_matches_speculative_stats_on_the_same_rounds(metric):
    # Two rows decoded together, ragged: row 1 finishes after the second round.
    stats = SpeculativeStats()
    stats.add_round(RoundStats(rows=[0, 1], accept_lengths=[3, 0], verify_lens=[8, 4], draft_time=0.0, verify_time=0.0))
    stats.add_round(RoundStats(rows=[0, 1], accept_lengths=[1, 2], verify_lens=[6, 3], draft_time=0.0, verify_time=0.0))
    stats.add_round(RoundStats(rows=[0], accept_lengths=[7], verify_lens=[8], draft_time=0.0, verify_time=0.0))
    stats.add_round(RoundStats(rows=[0], accept_lengths=[0], verify_lens=[1], draft_time=0.0, verify_time=0.0))
    per_row = {
        field: [[x for r in stats.rounds for row, x in zip(r.rows, getattr(r, field)) if row == i] for i in (0, 1)]
        for field in ("accept_lengths", "verify_lens")
    }
    scores = metric.compute(**_inputs(per_row["accept_lengths"], verify_lens=per_row["verify_lens"]))
    assert scores["tau"] == pytest.approx(stats.mean_accepted_length) and scores["tau"] != 1.0
    assert scores["accept_rate"] == pytest.approx(stats.accept_rate)


def test_inconsistent_rounds_are_refused(metric):
    with pytest.raises(ValueError, match="0 <= accepted < verified"):
        metric.compute(**_inputs([[4]], verify_lens=[[4]]))  # 4 accepted drafts need 5 verified tokens
    with pytest.raises(ValueError, match="pair up round by round"):
        metric.compute(**_inputs([[1, 1]], verify_lens=[[4]]))


@pytest.mark.parametrize(
    "bench_json", ["benchmarks/batch1/smollm2-135m.json", "benchmarks/batch1/qwen2.5-coder-1.5b.json"]
)
def test_bench_config_reproduces_the_bench_summary_from_its_records(bench_json):
    bench = json.loads((ROOT / bench_json).read_text())
    metric = evaluate.load(str(METRIC), "bench")
    columns = {field: [r[field] for r in bench["records"]] for field in metric.features}
    rows = [r for r in bench["results"] if r["domain"] == "all" and r["method"] != "target"]
    assert rows
    for row in rows:
        scores = metric.compute(**columns, spec_method=row["method"])
        assert round(scores["tau"], 3) == row["mean_accepted_length"], row["method"]
        assert (None if scores["accept_rate"] is None else round(scores["accept_rate"], 4)) == row["accept_rate"], row[
            "method"
        ]
        assert round(scores["speedup"], 3) == row["speedup"], row["method"]
        assert round(scores["exact_match"], 3) == row["same_as_target"], row["method"]


def test_bench_config_says_which_records_are_missing():
    metric = evaluate.load(str(METRIC), "bench")
    record = dict(method="adaflash", prompt=0, new_tokens=10, seconds=1.0, forwards=5, drafts=20, same=True)
    with pytest.raises(ValueError, match="no 'target' record"):
        metric.compute(**{k: [v] for k, v in record.items()})
    with pytest.raises(ValueError, match="no records of method 'adaflash-suffix'"):
        metric.compute(**{k: [v] for k, v in record.items()}, spec_method="adaflash-suffix")


def test_unknown_config_names_the_choices():
    with pytest.raises(ValueError, match="unknown config 'rounds'"):
        evaluate.load(str(METRIC), "rounds")
