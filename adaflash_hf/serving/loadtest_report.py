"""What ``adaflash bench --concurrency`` reports: per-level summaries, the printed table and the plot.

A level's summary pools its requests' records (latency, time to first token, queue wait, tokens) with the
difference of the scheduler's counters across the level (rounds, accepted and verified tokens).
"""

from __future__ import annotations


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


def print_table(results: list[dict]) -> None:
    plain = {r["concurrency"]: r["tokens_per_second"] for r in results if r["method"] == "plain"}
    header = (
        f"{'conc':>4} {'method':<12} {'tok/s':>8} {'vs plain':>8} {'p50 s':>7} {'p99 s':>7} {'ttft p50':>8} "
        f"{'queue p50':>9} {'tau':>5} {'verif/tok':>9} {'RSS MB':>7}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        ratio = r["tokens_per_second"] / plain[r["concurrency"]] if r["concurrency"] in plain else None

        def fmt(value, spec):
            return format(value, spec) if value is not None else "-"

        print(
            f"{r['concurrency']:>4} {r['method']:<12} {r['tokens_per_second']:>8.1f} {fmt(ratio, '>7.2f')}x "
            f"{fmt(r['p50_latency_s'], '>7.2f')} {fmt(r['p99_latency_s'], '>7.2f')} {fmt(r['ttft_p50_s'], '>8.3f')} "
            f"{fmt(r['queue_wait_p50_s'], '>9.3f')} {fmt(r['mean_accepted_length'], '>5.2f')} "
            f"{fmt(r['verified_per_accepted_token'], '>9.2f')} {r['peak_rss_mb']:>7.0f}"
        )


def plot_throughput(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for method in dict.fromkeys(r["method"] for r in results):
        rows = [r for r in results if r["method"] == method]
        axes[0].plot([r["concurrency"] for r in rows], [r["tokens_per_second"] for r in rows], marker="o", label=method)
        axes[1].plot([r["concurrency"] for r in rows], [r["p99_latency_s"] for r in rows], marker="o", label=method)
    for ax, label in zip(axes, ("output tokens / s", "p99 latency (s)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend()
    axes[0].set_title("Throughput")
    axes[1].set_title("Tail latency")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
