"""Bootstrap intervals over interleaved passes (adaflash_hf.serving.intervals) and how the concurrency bench's
report uses them: invariants that hold whatever the data, on synthetic passes (no models)."""

import numpy as np
import pytest

from adaflash_hf.serving.intervals import bootstrap_interval, pooled_percentile, rate, ratio
from adaflash_hf.serving.loadtest_report import add_intervals, percentile, print_table, with_interval

TOKENS = [640.0, 610.0, 655.0, 600.0, 630.0]
SECONDS = [10.0, 11.5, 9.8, 12.1, 10.4]


def test_the_interval_contains_the_point_estimate():
    rng = np.random.default_rng(7)
    for _ in range(20):
        tokens = rng.lognormal(6, 0.5, size=5)  # skewed, the case a percentile interval can miss its estimate
        seconds = rng.uniform(5, 15, size=5)
        interval = bootstrap_interval(rate(tokens, seconds), 5)
        assert interval.available and interval.low <= interval.estimate <= interval.high
    assert bootstrap_interval(rate(TOKENS, SECONDS), 5).estimate == pytest.approx(sum(TOKENS) / sum(SECONDS))


def test_identical_passes_give_a_zero_width_interval():
    interval = bootstrap_interval(rate([500.0] * 4, [10.0] * 4), 4)
    assert interval.available and interval.low == interval.estimate == interval.high == 50.0


def test_one_pass_gives_no_interval_rather_than_a_certain_looking_one():
    interval = bootstrap_interval(rate([500.0], [10.0]), 1)
    assert interval.estimate == 50.0 and not interval.available
    assert interval.to_dict() == {"estimate": 50.0, "low": None, "high": None}
    assert with_interval(interval.to_dict(), ".2f", "x") == "50.00x"


def test_the_ratio_of_a_method_to_itself_is_exactly_one():
    throughput = rate(TOKENS, SECONDS)
    same = bootstrap_interval(ratio(throughput, throughput), 5)
    assert same.estimate == same.low == same.high == 1.0
    twin = bootstrap_interval(ratio(throughput, rate(TOKENS, SECONDS)), 5)  # equal data, another statistic
    assert twin.estimate == twin.low == twin.high == 1.0


def test_ratios_are_paired_by_pass():
    """Drift that scales both methods' pass alike cancels: the ratio's interval has no width."""
    drift = np.array([1.0, 0.8, 1.2, 0.9, 1.1])
    plain = rate(100 * drift, [1.0] * 5)
    faster = rate(130 * drift, [1.0] * 5)
    paired = bootstrap_interval(ratio(faster, plain), 5)
    assert paired.low == pytest.approx(1.3) and paired.high == pytest.approx(1.3)
    assert bootstrap_interval(faster, 5).high > bootstrap_interval(faster, 5).low  # each alone does vary


def test_a_fixed_seed_gives_the_same_interval_and_another_seed_may_not():
    statistic = rate(TOKENS, SECONDS)
    assert bootstrap_interval(statistic, 5) == bootstrap_interval(statistic, 5)
    assert bootstrap_interval(statistic, 5, seed=3) == bootstrap_interval(statistic, 5, seed=3)


def test_a_wider_spread_gives_a_wider_interval():
    centre = np.full(5, 600.0)
    deviations = np.array([-30.0, 10.0, 25.0, -5.0, 0.0])
    widths = []
    for scale in (1, 2, 4):
        interval = bootstrap_interval(rate(centre + scale * deviations, [10.0] * 5), 5)
        widths.append(interval.high - interval.low)
    assert 0 < widths[0] < widths[1] < widths[2]


def test_the_pooled_percentile_matches_the_tables_rule():
    by_pass = [[1.0, 5.0, 2.0], [3.0, 9.0, 4.0], [7.0, 0.5, 6.0]]
    pooled = [v for values in by_pass for v in values]
    for q in (50, 90, 99):
        interval = bootstrap_interval(pooled_percentile(by_pass, q), 3)
        assert interval.estimate == percentile(pooled, q)
        assert min(pooled) <= interval.low <= interval.estimate <= interval.high <= max(pooled)


def test_bad_settings_fail_with_one_clear_line():
    with pytest.raises(ValueError, match="at least one pass"):
        bootstrap_interval(rate([], []), 0)
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        bootstrap_interval(rate(TOKENS, SECONDS), 5, confidence=95)
    with pytest.raises(ValueError, match="one amount per duration"):
        rate([1.0, 2.0], [1.0])


def level_rows(passes: int) -> list[dict]:
    """One level's rows as the bench writes them, with made-up passes: adaflash@4 ~1.3x plain, adaflash@16 ~1.1x."""
    rng = np.random.default_rng(1)
    rows = []
    for method, speed in (("plain", 100.0), ("adaflash@16", 110.0), ("adaflash@4", 130.0), ("adaflash", 125.0)):
        runs, requests = [], []
        for i in range(passes):
            seconds = 10.0 * (1 + 0.1 * i)  # the machine slows down pass by pass, for every method alike
            latencies = list(rng.uniform(1, 3, size=8) * 100 / speed)
            runs.append({"pass": i, "output_tokens": speed * 10.0 + 5 * rng.standard_normal(), "seconds": seconds})
            requests += [{"pass": i, "latency_s": latency} for latency in latencies]
        tokens, seconds = sum(r["output_tokens"] for r in runs), sum(r["seconds"] for r in runs)
        latencies = [r["latency_s"] for r in requests]
        rows.append(
            {
                "method": method,
                "concurrency": 4,
                "repeats": passes,
                "tokens_per_second": tokens / seconds,
                "p50_latency_s": percentile(latencies, 50),
                "p99_latency_s": percentile(latencies, 99),
                "ttft_p50_s": 0.1,
                "queue_wait_p50_s": 0.0,
                "mean_accepted_length": 2.0,
                "verified_per_accepted_token": 1.5,
                "peak_rss_mb": 1000.0,
                "passes": runs,
                "requests": requests,
            }
        )
    return rows


def test_every_row_gets_its_intervals_against_plain_and_the_best_fixed_length(capsys):
    rows = level_rows(5)
    add_intervals(rows)
    by_method = {r["method"]: r for r in rows}
    assert {r["best_fixed"] for r in rows} == {"adaflash@4"}
    assert by_method["plain"]["intervals"]["vs_plain"] == {"estimate": 1.0, "low": 1.0, "high": 1.0}
    assert by_method["adaflash@4"]["intervals"]["vs_best_fixed"] == {"estimate": 1.0, "low": 1.0, "high": 1.0}
    for row in rows:
        assert set(row["intervals"]) == {
            "tokens_per_second",
            "vs_plain",
            "vs_best_fixed",
            "p99_latency_s",
            "p99_vs_plain",
        }
        for interval in row["intervals"].values():
            assert interval["low"] <= interval["estimate"] <= interval["high"]
        assert row["intervals"]["p99_latency_s"]["estimate"] == row["p99_latency_s"]
        assert row["intervals"]["tokens_per_second"]["estimate"] == pytest.approx(row["tokens_per_second"])
    print_table(rows)
    out = capsys.readouterr().out
    assert "vs plain [95%]" in out and "best fixed length by throughput: c=4 adaflash@4" in out
    assert "1.00x [1.00, 1.00]" in out and "bootstrap over 5 interleaved passes" in out


def test_one_pass_keeps_the_plain_table_and_says_what_intervals_need(capsys):
    rows = level_rows(1)
    add_intervals(rows)
    assert all(i["low"] is None for r in rows for i in r["intervals"].values())
    print_table(rows)
    out = capsys.readouterr().out
    assert "[95%]" not in out and "vs plain" in out
    assert "no intervals: they need at least 2 passes per level; rerun with --repeats 5" in out


def test_methods_with_different_numbers_of_passes_cannot_be_paired():
    rows = level_rows(3)
    rows[0]["passes"] = rows[0]["passes"][:2]
    with pytest.raises(ValueError, match="same number of passes"):
        add_intervals(rows)


def test_the_plot_draws_error_bars_when_there_are_intervals(tmp_path):
    pytest.importorskip("matplotlib")
    from adaflash_hf.serving.loadtest_report import plot_throughput

    for passes in (1, 3):
        rows = level_rows(passes)
        add_intervals(rows)
        path = tmp_path / f"plot-{passes}.png"
        plot_throughput(rows, str(path))
        assert path.stat().st_size > 0
