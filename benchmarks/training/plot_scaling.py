"""Scaling curve of the SmolLM2-135M drafter: held-out tau against supervised tokens and CPU-hours.

Usage: python benchmarks/training/plot_scaling.py RUN_METRICS.jsonl [CONTINUATION_METRICS.jsonl ...] \\
    [--continues -1 0 1 ...] --out benchmarks/training/smollm2-135m-scaling.png

Each ``metrics.jsonl`` is what ``adaflash train-drafter`` logs. The first is the run that produced the starting
drafter; every later one continued a run before it (``--init-from``; the first unless ``--continues`` names
another) and restarts its counters at 0, so it is drawn after that run (its tokens and CPU-hours offset by that
run's end, CPU-hours counted with each run's ``--num-threads``). Each run evaluates on its own held-out split, so
a continuation's step-0 point (the same drafter) shows the offset between the two splits.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def read_curve(path: Path) -> tuple[list[tuple[float, float, float]], float, float]:
    """[(supervised tokens, minutes, held-out tau)] at every evaluation, and the run's final tokens and minutes."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    train = [r for r in records if r["kind"] == "train"]
    tokens_at = {r["step"]: r["tokens_seen"] for r in train}
    steps = sorted(tokens_at)

    def tokens(step: int) -> float:  # train records come every 10 steps: take the nearest logged one
        return tokens_at[min(steps, key=lambda s: abs(s - step))] if steps and step else 0.0

    points = [(tokens(r["step"]), r["minutes"], r["tau"]) for r in records if r["kind"] == "eval"]
    return points, (train[-1]["tokens_seen"] if train else 0.0), (train[-1]["minutes"] if train else 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="metrics.jsonl of a run, then of runs that continued it")
    parser.add_argument("--labels", nargs="*", default=None)
    parser.add_argument(
        "--threads",
        nargs="*",
        type=float,
        default=None,
        help="torch threads of each run, a mean where a run changed them (default: 1 each)",
    )
    parser.add_argument(
        "--continues",
        nargs="*",
        type=int,
        default=None,
        help="for each run, the 0-based position of the run it continued (-1: none; default: the first run)",
    )
    parser.add_argument("--out", default="benchmarks/training/smollm2-135m-scaling.png")
    args = parser.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_tokens, by_hours) = plt.subplots(1, 2, figsize=(11, 5.5))
    ends: list[tuple[float, float]] = []  # (tokens, CPU-hours) at the end of each run, offsets included
    for i, path in enumerate(args.runs):
        points, total_tokens, total_minutes = read_curve(path)
        label = args.labels[i] if args.labels and i < len(args.labels) else path.parent.name
        threads = args.threads[i] if args.threads and i < len(args.threads) else 1
        parent = args.continues[i] if args.continues and i < len(args.continues) else (0 if i else -1)
        if parent >= i:
            raise SystemExit(f"error: --continues: run {i} can only continue an earlier run, not {parent}")
        offset_tokens, offset_hours = ends[parent] if parent >= 0 else (0.0, 0.0)
        ends.append((offset_tokens + total_tokens, offset_hours + total_minutes * threads / 60))
        xs = [(offset_tokens + t) / 1e6 for t, _, _ in points]
        hours = [offset_hours + m * threads / 60 for _, m, _ in points]
        taus = [tau for _, _, tau in points]
        marker = "o" if len(points) <= 30 else None
        color = plt.get_cmap("tab20")(i % 20)  # one colour per run (the default cycle repeats after 10)
        by_tokens.plot(xs, taus, marker=marker, label=label, color=color)
        by_hours.plot(hours, taus, marker=marker, label=label, color=color)
    by_tokens.set_xlabel("supervised tokens (millions)")
    by_hours.set_xlabel("CPU-hours")
    for ax in (by_tokens, by_hours):
        ax.set_ylabel("held-out tau (teacher-forced)")
        ax.grid(alpha=0.3)
    handles, names = by_tokens.get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=2, fontsize=8, frameon=False)  # below both panels
    fig.suptitle("SmolLM2-135M drafter: held-out tau vs training compute")
    fig.tight_layout(rect=(0, 0.05 + 0.03 * ((len(names) + 1) // 2), 1, 1))
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
