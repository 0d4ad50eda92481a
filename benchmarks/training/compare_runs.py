"""Held-out τ of drafter training runs side by side: initialisation, depth and continuation experiments.

Each run is an ``adaflash train-drafter`` output folder; this script reads its ``metrics.jsonl`` (held-out
evaluations) and its checkpoint state, prints one row per run and writes ``benchmarks/training/drafter_runs.json``,
from which ``benchmarks/make_tables.py`` renders the ``drafter_runs`` table:

    python benchmarks/training/compare_runs.py "random init=runs/init_random" "target init=runs/init_target" ...

Runs compared at equal optimizer steps share the recipe except for the one named change.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run_record(label: str, folder: Path) -> dict:
    """The recipe, evaluations and compute of one run folder."""
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    # the last step is evaluated again after the loop ends: keep one evaluation per step
    by_step = {e["step"]: e for e in (json.loads(line) for line in lines if '"eval"' in line)}
    evals = [by_step[step] for step in sorted(by_step)]
    summary_path = folder / "drafter" / "training_summary.json"
    recipe = json.loads(summary_path.read_text())["recipe"] if summary_path.exists() else {}
    keep = (
        "num_layers",
        "block_size",
        "init_layers",
        "init_from",
        "add_layers",
        "lr",
        "num_anchors",
        "draft_vocab_size",
        "feature_cache",
        "corpus_fraction",
        "max_steps",
        "num_threads",
        "seed",
    )
    config_path = folder / "drafter" / "config.json"
    layers = (
        json.loads(config_path.read_text())["num_hidden_layers"]
        if config_path.exists()
        else (recipe.get("num_layers") or 0) + (recipe.get("add_layers") or 0) or None
    )
    return {
        "label": label,
        "run": folder.name,
        "layers": layers,
        "recipe": {k: recipe.get(k) for k in keep},
        "evaluations": [{k: e[k] for k in ("step", "minutes", "tau", "position_acceptance")} for e in evals],
    }


def engine_record(path: Path) -> dict:
    """The drafter alone through transformers' DFlash path (method dflash-builtin, all domains) in a bench JSON."""
    bench = json.loads(path.read_text())
    rows = {(r["method"], r["domain"]): r for r in bench["results"]}
    row = rows.get(("dflash-builtin", "all"))
    if row is None:
        raise SystemExit(f"error: {path} has no dflash-builtin row: run adaflash bench --methods target,dflash-builtin")
    return {
        "bench_json": str(path),
        "tau": row["mean_accepted_length"],
        "speedup": row["speedup"],
        "tokens_per_second": row["tokens_per_second"],
        "num_prompts": sum(r["num_prompts"] for (m, d), r in rows.items() if m == "dflash-builtin" and d != "all"),
        "machine": bench.get("provenance", {}).get("machine"),
    }


def shell_word(arg: str) -> str:
    """``arg`` quoted for a POSIX shell, the home folder written as ``$HOME`` (so the command runs for anyone)."""
    home = str(Path.home())
    if home in arg and not any(c in arg for c in '"$`\\'):
        return '"' + arg.replace(home, "$HOME") + '"'
    return shlex.quote(arg)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="LABEL=FOLDER of each train-drafter run, in table order.")
    parser.add_argument(
        "--machine", required=True, help="The machine the runs trained on, as the table should name it."
    )
    parser.add_argument("--output", default=str(HERE / "drafter_runs.json"))
    parser.add_argument(
        "--engine",
        nargs="*",
        default=[],
        metavar="LABEL=BENCH_JSON",
        help="An `adaflash bench` JSON with a dflash-builtin row for the run LABEL: its drafter-alone τ and "
        "speed-up over plain decoding join the run's record.",
    )
    args = parser.parse_args()
    engines = {}
    for item in args.engine:
        label, _, path = item.partition("=")
        if not path:
            raise SystemExit(f"error: --engine {item!r}: give LABEL=BENCH_JSON")
        engines[label] = engine_record(Path(path))
    records = []
    for item in args.runs:
        label, _, folder = item.partition("=")
        if not folder:
            raise SystemExit(f"error: {item!r}: give LABEL=FOLDER")
        records.append(run_record(label, Path(folder)))
        if label in engines:
            records[-1]["engine"] = engines[label]
    print("| run | held-out τ by step | acceptance at positions 1-3 (last evaluation) |")
    print("|---|---|---|")
    for r in records:
        curve = ", ".join(f"{e['step']}: {e['tau']:.3f}" for e in r["evaluations"])
        last = r["evaluations"][-1]["position_acceptance"][:3] if r["evaluations"] else []
        print(f"| {r['label']} | {curve} | {', '.join(f'{a:.2f}' for a in last)} |")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True).stdout
    provenance = {
        "command": " ".join(["python benchmarks/training/compare_runs.py", *map(shell_word, sys.argv[1:])]),
        "machine": args.machine,
        "code_commit": commit.strip() or "unknown",
        "date": time.strftime("%Y-%m-%d"),
    }
    Path(args.output).write_text(json.dumps({"provenance": provenance, "runs": records}, indent=1))


if __name__ == "__main__":
    main()
