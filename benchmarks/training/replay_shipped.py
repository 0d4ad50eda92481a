"""Every SmolLM2-135M drafter this repository shipped, replayed on the same held-out answers: drafter-alone τ per
domain against the training compute behind it.

Usage: python benchmarks/training/replay_shipped.py [--json benchmarks/training/smollm2-135m-replay.json] \\
    [--plot benchmarks/training/smollm2-135m-replay.png] [--num-threads 2]

Each stage's weights come from git (the bundled folder at the commit that shipped it) and go through
`adaflash replay-drafter` (:mod:`adaflash_hf.training.replay`) on the 32 held-out prompts of `adaflash bench`
(8 per domain, 96-token greedy answers, bf16). The compute behind a stage is the sum over the training runs of its
chain, read from their committed ``metrics.jsonl`` (minutes × torch threads, supervised tokens). No timing: it runs
on a busy machine as well as on an idle one.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BUNDLED = "adaflash_hf/bundled/smollm2-135m"
# (commit that shipped the weights, label, the training runs it adds to the stage before, with their torch threads)
STAGES = (
    ("27c2b7b", "first run", [("smollm2-135m-metrics.jsonl", 1)]),
    (
        "82c3890",
        "two cached-response stages",
        [
            ("smollm2-135m-cached-responses-metrics.jsonl", 1),
            ("smollm2-135m-cached-responses-2-metrics.jsonl", 1),
        ],
    ),
    ("5b18ec1", "a third cached-response stage", [("smollm2-135m-cached-responses-3-metrics.jsonl", 1)]),
    ("376ffa4", "greedy + sampled answers", [("smollm2-135m-cached-sampled-metrics.jsonl", 2)]),
    ("f08fab3", "greedy + sampled answers, 24,000 steps more", [("smollm2-135m-cached-sampled-2-metrics.jsonl", 2)]),
)
WEIGHT_FILES = ("config.json", "model.safetensors")


def run_totals(name: str, threads: int) -> tuple[float, float]:
    """(CPU-hours, supervised tokens) of one logged training run."""
    records = [json.loads(line) for line in (HERE / name).read_text().splitlines() if line.strip()]
    last = [r for r in records if r["kind"] == "train"][-1]
    return last["minutes"] * threads / 60, last["tokens_seen"]


def extract(commit: str, dest: Path) -> Path:
    """The bundled drafter's weights as shipped at ``commit``, in ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in WEIGHT_FILES:
        blob = subprocess.run(
            ["git", "show", f"{commit}:{BUNDLED}/{name}"], cwd=ROOT, check=True, capture_output=True
        ).stdout
        (dest / name).write_bytes(blob)
    return dest


def plot(stages: list[dict], results: list[dict], out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hours = [s["cpu_hours"] for s in stages]
    fig, ax = plt.subplots(figsize=(7, 4))
    for domain in dict.fromkeys(r["domain"] for r in results):
        taus = [
            next(r["tau"] for r in results if r["drafter"] == s["commit"] and r["domain"] == domain) for s in stages
        ]
        ax.plot(hours, taus, marker="o", label=domain, linewidth=2.5 if domain == "all" else 1.2)
    ax.axhline(2.0, color="grey", linestyle="--", linewidth=1, label="goal, all domains")
    ax.set_xlabel("accumulated training CPU-hours")
    ax.set_ylabel("drafter-alone tau (replayed)")
    ax.set_title("SmolLM2-135M: shipped drafters on 32 held-out prompts")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=str(HERE / "smollm2-135m-replay.json"))
    parser.add_argument("--plot", default=str(HERE / "smollm2-135m-replay.png"))
    parser.add_argument("--num-threads", type=int, default=2)
    args = parser.parse_args()

    from adaflash_hf.training.replay import ReplayDrafterArgs, run_replay_drafter

    stages, hours, tokens = [], 0.0, 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for commit, label, runs in STAGES:
            for name, threads in runs:
                h, t = run_totals(name, threads)
                hours, tokens = hours + h, tokens + t
            extract(commit, Path(tmp) / commit)
            stages.append({"commit": commit, "label": label, "cpu_hours": hours, "supervised_tokens": tokens})
        replay_json = Path(tmp) / "replay.json"
        run_replay_drafter(
            ReplayDrafterArgs(
                drafters=",".join(str(Path(tmp) / s["commit"]) for s in stages),
                dtype="bf16",
                num_threads=args.num_threads,
                json=str(replay_json),
            )
        )
        report = json.loads(replay_json.read_text())
    for r in report["results"]:
        r["drafter"] = Path(r["drafter"]).name  # the commit
    report["args"]["drafters"] = ",".join(s["commit"] for s in stages)
    report["command"] = "python benchmarks/training/replay_shipped.py"
    report["stages"] = stages
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")
    if args.plot:
        plot(stages, report["results"], args.plot)


if __name__ == "__main__":
    main()
