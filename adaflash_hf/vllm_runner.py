"""Greedy generation with vLLM on token-id prompts, timed, with vLLM's speculative-decoding counters: a script.

It runs inside the vLLM environment (``adaflash setup-vllm``), which does not have adaflash-hf installed,
so it imports only the standard library and vLLM::

    VLLM_PYTHON adaflash_hf/vllm_runner.py --spec SPEC.json --output RESULT.json

``--spec`` is a JSON file (or a JSON string) with::

    model               the target's transformers folder
    speculative_config  vLLM's speculative config (null: plain decoding), e.g.
                        {"method": "dflash", "model": DRAFTER_DIR, "num_speculative_tokens": 7}
    prompts             token-id lists (tokenized by the caller, so every engine sees the same tokens)
    max_tokens          new tokens per prompt (greedy; a prompt stops early at EOS unless "ignore_eos" is true)
    modes               any of "batch1" (one request at a time) and "concurrent" (all prompts in one
                        LLM.generate call, at most max_num_seqs at once)
    dtype, max_model_len, max_num_seqs, ignore_eos, warmup_tokens   optional

The result JSON holds, per mode: each prompt's output token ids, the wall time (per prompt at batch 1),
tokens/s, and vLLM's counters over that mode alone (drafts, draft tokens, accepted tokens, accepted
tokens by draft position), from which tau = 1 + accepted / drafts.
"""

from __future__ import annotations

import os
import sys

# Run as a script, this file's folder (the package) leads sys.path, and its profile.py would shadow the standard
# library's module of that name, which torch imports: drop the folder before importing anything else.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

MODES = ("batch1", "concurrent")
SPEC_PREFIX = "vllm:spec_decode_"


def spec_counters(llm) -> dict:
    """vLLM's cumulative speculative-decoding counters (all zero without speculation), summed over engines."""
    counters = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "num_accepted_tokens_per_pos": []}
    for metric in llm.get_metrics():
        key = metric.name.removeprefix(SPEC_PREFIX)
        if not metric.name.startswith(SPEC_PREFIX) or key not in counters:
            continue
        if hasattr(metric, "values"):  # a Vector: one count per draft position
            old = counters[key] + [0] * (len(metric.values) - len(counters[key]))
            counters[key] = [a + b for a, b in zip(old, list(metric.values) + [0] * len(old))]
        else:
            counters[key] += metric.value
    return counters


def counter_delta(after: dict, before: dict) -> dict:
    """Counters accumulated between two snapshots, with tau and acceptance by position."""
    delta = {k: after[k] - before[k] for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")}
    per_pos_before = before["num_accepted_tokens_per_pos"] or [0] * len(after["num_accepted_tokens_per_pos"])
    per_pos = [a - b for a, b in zip(after["num_accepted_tokens_per_pos"], per_pos_before)]
    drafts = delta["num_drafts"]
    delta["num_accepted_tokens_per_pos"] = per_pos
    delta["tau"] = 1 + delta["num_accepted_tokens"] / drafts if drafts else None
    delta["accept_rate"] = delta["num_accepted_tokens"] / delta["num_draft_tokens"] if drafts else None
    delta["acceptance_by_position"] = [n / drafts for n in per_pos] if drafts else []  # P(draft k accepted)
    return delta


def generate(llm, prompts: list[list[int]], params) -> tuple[list[list[int]], float]:
    """Output token ids of ``prompts`` (one LLM.generate call) and its wall time."""
    from vllm.inputs import TokensPrompt

    start = time.perf_counter()
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    seconds = time.perf_counter() - start
    return [list(o.outputs[0].token_ids) for o in outputs], seconds


def run(spec: dict) -> dict:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(spec.get("kv_cache_gb", 2)))
    import vllm
    from vllm import LLM, SamplingParams

    prompts = [list(map(int, p)) for p in spec["prompts"]]
    modes = spec.get("modes", list(MODES))
    unknown = set(modes) - set(MODES)
    if unknown or not prompts:
        raise SystemExit(f"vllm_runner: unknown modes {sorted(unknown)} or no prompts in the spec")
    start = time.perf_counter()
    llm = LLM(
        model=spec["model"],
        speculative_config=spec.get("speculative_config"),
        dtype=spec.get("dtype", "bfloat16"),
        enforce_eager=True,
        max_model_len=spec.get("max_model_len", 1024),
        max_num_seqs=spec.get("max_num_seqs", 16),
        seed=0,
        disable_log_stats=False,  # get_metrics() reads the stat loggers
    )
    load_seconds = time.perf_counter() - start
    params = SamplingParams(
        temperature=0.0, max_tokens=spec["max_tokens"], ignore_eos=spec.get("ignore_eos", False), detokenize=False
    )
    if spec.get("warmup_tokens", 8):  # first calls pay one-off costs; their counters are left out below
        warm = SamplingParams(temperature=0.0, max_tokens=spec.get("warmup_tokens", 8), detokenize=False)
        generate(llm, prompts[:1], warm)
    result = {"vllm_version": vllm.__version__, "load_seconds": load_seconds, "modes": {}}
    for mode in modes:
        before = spec_counters(llm)
        per_prompt = None
        if mode == "batch1":
            outputs, seconds, per_prompt = [], [], []
            for prompt in prompts:
                start = spec_counters(llm)
                (output,), took = generate(llm, [prompt], params)
                outputs.append(output)
                seconds.append(took)
                counts = counter_delta(spec_counters(llm), start)
                per_prompt.append([counts["num_drafts"], counts["num_accepted_tokens"]])
            wall = sum(seconds)
        else:
            outputs, wall = generate(llm, prompts, params)
            seconds = None
        tokens = sum(len(o) for o in outputs)
        result["modes"][mode] = {
            "outputs": outputs,
            "seconds": seconds,
            "wall_seconds": wall,
            "new_tokens": tokens,
            "tokens_per_second": tokens / wall,
            "spec": counter_delta(spec_counters(llm), before),
            "drafts_and_accepted_per_prompt": per_prompt,  # batch 1 only: each prompt's [drafts, accepted tokens]
        }
        print(f"[vllm_runner] {mode}: {tokens} tokens in {wall:.2f} s = {tokens / wall:.1f} tok/s", file=sys.stderr)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, help="a JSON file, or a JSON string starting with '{'")
    parser.add_argument("--output", required=True, help="where to write the result JSON")
    args = parser.parse_args(argv)
    text = args.spec if args.spec.lstrip().startswith("{") else open(args.spec).read()
    result = run(json.loads(text))
    with open(args.output, "w") as handle:
        json.dump(result, handle)
    return 0


if __name__ == "__main__":  # vLLM starts worker processes that import this file again
    sys.exit(main())
