"""What ``adaflash bench`` reports from its per-prompt records: the summary per method and domain, the table it
prints and the plot it writes.

Acceptance is pooled from counts (hits and verified drafts per position), never averaged over ratios.
"""

from __future__ import annotations


def summarise(records: list[dict], methods: list[str]) -> list[dict]:
    """One entry per method and domain (and 'all'): throughput, tau, accept rate, speed-up, equality."""
    results = []
    domains = sorted({r["domain"] for r in records}) + ["all"]
    for domain in domains:
        rows = {m: [r for r in records if r["method"] == m and domain in ("all", r["domain"])] for m in methods}
        base_tps = sum(r["new_tokens"] for r in rows["target"]) / sum(r["seconds"] for r in rows["target"])
        for method in methods:
            group = rows[method]
            tokens = sum(r["new_tokens"] for r in group)
            seconds = sum(r["seconds"] for r in group)
            forwards = sum(r["forwards"] for r in group)
            drafts = sum(r["drafts"] for r in group)
            accepted = tokens - forwards
            tps = tokens / seconds
            acceptance = pooled_position_acceptance(group)
            results.append(
                dict(
                    method=method,
                    domain=domain,
                    num_prompts=len(group),
                    new_tokens=tokens,
                    tokens_per_second=round(tps, 3),
                    mean_accepted_length=round(tokens / forwards, 3),
                    accept_rate=round(max(accepted, 0) / drafts, 4) if drafts else None,
                    speedup=round(tps / base_tps, 3),
                    same_as_target=round(sum(r["same"] for r in group) / len(group), 3),
                    position_acceptance=acceptance,
                    sources=pooled_sources(group),
                )
            )
    return results


def pooled_sources(records: list[dict]) -> dict[str, dict] | None:
    """Per draft source: the fraction of rounds that used it and the drafts it got accepted per round."""
    counts: dict[str, list[int]] = {}
    for r in records:
        for source, (rounds, accepted) in (r.get("sources") or {}).items():
            total = counts.setdefault(source, [0, 0])
            total[0] += rounds
            total[1] += accepted
    if not counts:
        return None
    all_rounds = sum(n for n, _ in counts.values())
    return {
        source: {"round_fraction": round(n / all_rounds, 4), "accepted_per_round": round(a / n, 3)}
        for source, (n, a) in sorted(counts.items())
    }


def pooled_position_acceptance(records: list[dict]) -> list[float | None] | None:
    """P(accept draft k | verified k) pooled over records' (hits, seen) counts; None where k was never verified."""
    counts = [r["positions"] for r in records if r.get("positions")]
    if not counts:
        return None
    hits = [sum(c[0][k] for c in counts) for k in range(len(counts[0][0]))]
    seen = [sum(c[1][k] for c in counts) for k in range(len(counts[0][1]))]
    return [round(h / s, 4) if s else None for h, s in zip(hits, seen)]


def print_table(results: list[dict]) -> None:
    header = (
        f"{'domain':<8} {'method':<18} {'prompts':>7} {'tokens':>7} {'tok/s':>7} {'tau':>6} {'accept':>7} "
        f"{'speedup':>8} {'same':>5}"
        "  sources (share of rounds / drafts accepted per round)"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        accept = "-" if r["accept_rate"] is None else f"{r['accept_rate']:.2f}"
        sources = " ".join(
            f"{k}:{v['round_fraction']:.0%}/{v['accepted_per_round']:.2f}" for k, v in (r.get("sources") or {}).items()
        )
        print(
            f"{r['domain']:<8} {r['method']:<18} {r['num_prompts']:>7} {r['new_tokens']:>7} "
            f"{r['tokens_per_second']:>7.2f} "
            f"{r['mean_accepted_length']:>6.2f} {accept:>7} {r['speedup']:>7.2f}x {r['same_as_target']:>5.2f}  "
            f"{sources}"
        )


def plot_results(records: list[dict], results: list[dict], path: str) -> None:
    """Two panels: speed-up over the target per method and domain; AdaFlash acceptance by draft position."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    domains = sorted({r["domain"] for r in results})
    methods = [m for m in dict.fromkeys(r["method"] for r in results)]
    width = 0.8 / len(methods)
    for j, method in enumerate(methods):
        values = [next(r["speedup"] for r in results if r["method"] == method and r["domain"] == d) for d in domains]
        left.bar([i + j * width for i in range(len(domains))], values, width, label=method)
    left.axhline(1.0, color="black", linewidth=0.8)
    left.set_xticks([i + width * (len(methods) - 1) / 2 for i in range(len(domains))], domains)
    left.set_ylabel("speed-up over target (tokens/s ratio)")
    left.legend(fontsize=8)
    # one curve set: verify lengths cut curves short
    ours = next((m for m in methods if m.startswith("adaflash")), None)
    for domain in sorted({r["domain"] for r in records}):
        pooled = pooled_position_acceptance([r for r in records if r["domain"] == domain and r["method"] == ours])
        if pooled:
            # positions never verified are left out
            points = [(k + 1, a) for k, a in enumerate(pooled) if a is not None]
            right.plot([k for k, _ in points], [a for _, a in points], marker="o", label=domain)
    right.set_xlabel("draft position k")
    right.set_ylabel("P(accept k | reached k)")
    right.set_ylim(0, 1)
    right.set_title(f"{ours} acceptance by position" if ours else "AdaFlash acceptance by position")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
