"""What ``adaflash bench --concurrency`` reports: per-level summaries, the printed table and the plot.

A level's summary pools its requests' records (latency, time to first token, queue wait, tokens) with the
difference of the scheduler's counters across the level (rounds, accepted and verified tokens). With two or
more interleaved passes, every row also carries bootstrap 95 % intervals over its passes
(:mod:`adaflash_hf.serving.intervals`), paired by pass across the methods of a level.
"""

from __future__ import annotations

from .intervals import (
    CONFIDENCE,
    MIN_PASSES,
    RECOMMENDED_PASSES,
    RESAMPLES,
    SEED,
    bootstrap_interval,
    pooled_percentile,
    rate,
    ratio,
)


def percentile(values: list[float], q: float) -> float | None:
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    k = min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))
    return values[k]


def summarise(
    method: str, concurrency: int, records: list[dict], seconds: float, peak: float, before: dict, after: dict
) -> dict:
    delta = {k: after["counters"][k] - before["counters"].get(k, 0) for k in after["counters"]}
    tokens = sum(r["tokens"] for r in records)
    return {
        "method": method,
        "concurrency": concurrency,
        "num_requests": len(records),
        "output_tokens": tokens,
        "seconds": seconds,
        "tokens_per_second": tokens / seconds,
        "p50_latency_s": percentile([r["latency_s"] for r in records], 50),
        "p99_latency_s": percentile([r["latency_s"] for r in records], 99),
        "ttft_p50_s": percentile([r["ttft_s"] for r in records], 50),
        "queue_wait_p50_s": percentile([r["queue_wait_s"] for r in records], 50),
        "mean_accepted_length": delta["round_tokens"] / delta["row_rounds"] if delta["row_rounds"] else None,
        "verified_per_accepted_token": delta["verified_tokens"] / delta["round_tokens"]
        if delta["round_tokens"]
        else None,
        "rounds": delta["rounds"],
        "peak_rss_mb": peak,
    }


def pass_summary(index: int, position: int, started_s: float, summary: dict) -> dict:
    """One measured pass of one method at one level: its :func:`summarise` without the method and level, with the
    pass's index, the method's place in the pass's order (0: ran first) and its start (seconds since the first
    measured pass began), so the interleaving can be read back from the JSON."""
    rest = {k: v for k, v in summary.items() if k not in ("method", "concurrency")}
    return {"pass": index, "position": position, "started_s": started_s, **rest}


def interval_settings() -> dict:
    """How the intervals in a result were computed (recorded once in the JSON)."""
    return {
        "method": "percentile bootstrap over passes, paired by pass index across the methods of a level",
        "confidence": CONFIDENCE,
        "resamples": RESAMPLES,
        "seed": SEED,
        "min_passes": MIN_PASSES,
    }


def add_intervals(rows: list[dict]) -> None:
    """Give each row of one level ``intervals`` and ``best_fixed``, computed from its ``passes`` and ``requests``.

    Intervals: ``tokens_per_second``, ``vs_plain`` (throughput over plain's), ``vs_best_fixed`` (over the
    ``adaflash@N`` with the highest throughput at this level), ``p99_latency_s`` and ``p99_vs_plain``; the
    ratios only where plain or a fixed length was measured. With one pass the bounds are None."""
    counts = {len(r["passes"]) for r in rows}
    if len(counts) != 1:
        raise ValueError(f"paired intervals need the same number of passes for every method, got {sorted(counts)}.")
    passes = counts.pop()
    throughput, p99 = {}, {}
    for r in rows:
        throughput[r["method"]] = rate([p["output_tokens"] for p in r["passes"]], [p["seconds"] for p in r["passes"]])
        latencies = [[q["latency_s"] for q in r["requests"] if q["pass"] == i] for i in range(passes)]
        p99[r["method"]] = pooled_percentile(latencies, 99)
    fixed = [r for r in rows if r["method"].startswith("adaflash@")]
    best = max(fixed, key=lambda r: r["tokens_per_second"])["method"] if fixed else None
    for r in rows:
        method = r["method"]
        statistics = {"tokens_per_second": throughput[method], "p99_latency_s": p99[method]}
        if "plain" in throughput:
            statistics["vs_plain"] = ratio(throughput[method], throughput["plain"])
            statistics["p99_vs_plain"] = ratio(p99[method], p99["plain"])
        if best:
            statistics["vs_best_fixed"] = ratio(throughput[method], throughput[best])
        r["best_fixed"] = best
        r["intervals"] = {name: bootstrap_interval(s, passes).to_dict() for name, s in statistics.items()}


def with_interval(interval: dict | None, spec: str, unit: str = "") -> str:
    """``1.08x [0.97, 1.19]``: an estimate and its bounds (just the estimate where the bounds are unavailable)."""
    if interval is None:
        return "-"
    text = format(interval["estimate"], spec) + unit
    if interval["low"] is None:
        return text
    return f"{text} [{interval['low']:{spec}}, {interval['high']:{spec}}]"


def fmt(value, spec: str) -> str:
    """``value`` formatted, or ``-`` where it is missing."""
    return format(value, spec) if value is not None else "-"


def has_intervals(results: list[dict]) -> bool:
    """Whether the rows carry intervals with bounds (2 or more passes)."""
    return any((r.get("intervals") or {}).get("tokens_per_second", {}).get("low") is not None for r in results)


def print_table(results: list[dict]) -> None:
    """The summary table: point estimates with one pass (and a note that intervals need 2 or more); with 2 or
    more passes, :func:`print_interval_table`."""
    if has_intervals(results):
        print_interval_table(results)
        return
    plain = {r["concurrency"]: r["tokens_per_second"] for r in results if r["method"] == "plain"}
    header = (
        f"{'conc':>4} {'method':<12} {'tok/s':>8} {'vs plain':>8} {'p50 s':>7} {'p99 s':>7} {'ttft p50':>8} "
        f"{'queue p50':>9} {'tau':>5} {'verif/tok':>9} {'RSS MB':>7}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        ratio = r["tokens_per_second"] / plain[r["concurrency"]] if r["concurrency"] in plain else None
        print(
            f"{r['concurrency']:>4} {r['method']:<12} {r['tokens_per_second']:>8.1f} {fmt(ratio, '>7.2f')}x "
            f"{fmt(r['p50_latency_s'], '>7.2f')} {fmt(r['p99_latency_s'], '>7.2f')} {fmt(r['ttft_p50_s'], '>8.3f')} "
            f"{fmt(r['queue_wait_p50_s'], '>9.3f')} {fmt(r['mean_accepted_length'], '>5.2f')} "
            f"{fmt(r['verified_per_accepted_token'], '>9.2f')} {r['peak_rss_mb']:>7.0f}"
        )
    if results and max(r.get("repeats", 1) for r in results) < MIN_PASSES:
        print(
            f"(no intervals: they need at least {MIN_PASSES} passes per level; "
            f"rerun with --repeats {RECOMMENDED_PASSES} to see how sure these numbers are)"
        )


def print_interval_table(results: list[dict]) -> None:
    """The summary table with the ratios to plain and to the best fixed length and the p99 (and its ratio to plain's)
    each followed by its 95 % interval, then which fixed length was best at each level and how intervals were made."""
    header = (
        f"{'conc':>4} {'method':<12} {'tok/s':>8} {'vs plain [95%]':>20} {'vs best fixed [95%]':>20} "
        f"{'p50 s':>6} {'p99 s [95%]':>20} {'p99 vs plain [95%]':>20} {'ttft p50':>8} {'tau':>5} "
        f"{'verif/tok':>9} {'RSS MB':>7}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        intervals = r["intervals"]
        print(
            f"{r['concurrency']:>4} {r['method']:<12} {r['tokens_per_second']:>8.1f} "
            f"{with_interval(intervals.get('vs_plain'), '.2f', 'x'):>20} "
            f"{with_interval(intervals.get('vs_best_fixed'), '.2f', 'x'):>20} {fmt(r['p50_latency_s'], '>6.2f')} "
            f"{with_interval(intervals.get('p99_latency_s'), '.2f'):>20} "
            f"{with_interval(intervals.get('p99_vs_plain'), '.2f', 'x'):>20} {fmt(r['ttft_p50_s'], '>8.3f')} "
            f"{fmt(r['mean_accepted_length'], '>5.2f')} {fmt(r['verified_per_accepted_token'], '>9.2f')} "
            f"{r['peak_rss_mb']:>7.0f}"
        )
    best = {r["concurrency"]: r["best_fixed"] for r in results if r.get("best_fixed")}
    if best:
        print("best fixed length by throughput: " + ", ".join(f"c={c} {m}" for c, m in best.items()))
    passes = max(r.get("repeats", 1) for r in results)
    print(
        f"[95%]: percentile bootstrap over {passes} interleaved passes, paired by pass, {RESAMPLES} resamples"
        + (f" (a claim on a 2-core machine needs {RECOMMENDED_PASSES}+)" if passes < RECOMMENDED_PASSES else "")
    )


def plot_throughput(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = has_intervals(results)  # error bars: the 95 % intervals over passes
    ratios = bars and any(r["method"] == "plain" for r in results)
    panels = [
        ("tokens_per_second", "output tokens / s", "Throughput"),
        ("p99_latency_s", "p99 latency (s)", "Tail latency"),
    ]
    if ratios:
        panels.append(("vs_plain", "throughput / plain's", "Throughput over plain (paired)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4))
    for method in dict.fromkeys(r["method"] for r in results):
        rows = [r for r in results if r["method"] == method]
        levels = [r["concurrency"] for r in rows]
        for ax, (key, _, _) in zip(axes, panels):
            if not bars:
                ax.plot(levels, [r[key] for r in rows], marker="o", label=method)
                continue
            spans = [r["intervals"][key] for r in rows]
            middle = [s["estimate"] for s in spans]
            below = [s["estimate"] - s["low"] for s in spans]
            above = [s["high"] - s["estimate"] for s in spans]
            ax.errorbar(levels, middle, yerr=[below, above], marker="o", capsize=3, label=method)
    for ax, (_, label, title) in zip(axes, panels):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.set_title(title)
    if ratios:  # where a ratio's bar crosses this line, the passes do not separate the method from plain
        axes[2].axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
