"""``adaflash bench``: decoding methods side by side on the same prompts, in one process.

Methods (each prompt runs every method back to back, so machine noise hits all of them alike):
- ``target``: plain ``generate`` of the target, the 1.0x reference;
- ``adaflash``: adaflash-hf's engine in its default configuration (hybrid drafting: drafter block,
  suffix matches, the global index and the datastore merged into a draft tree per row, with the goodput
  verify length);
- ``adaflash-chain``: the default sources, but each round verifies only the best candidate (no draft tree);
- ``adaflash-drafter``, ``adaflash-suffix``, ``adaflash-global``, ``adaflash-datastore``: the engine
  with one draft source alone (the drafter's block; the prompt and output so far; earlier requests;
  the drafter's datastore of the target's own outputs);
- ``adaflash...@N`` for any of these: a fixed verify length of N tokens (anchor + drafts);
- ``prompt-lookup``: transformers' prompt lookup decoding;
- ``assisted``: transformers' assisted generation with an autoregressive draft model;
- ``dflash-builtin``: transformers' own ``speculation_type="dflash"`` path with the same drafter.

``--quality`` checks task results instead of speed (:mod:`adaflash_hf.quality`); ``--concurrency``
measures served throughput (:mod:`adaflash_hf.serving.loadtest`).

Acceptance is measured the same way for every method, from the target's forward passes: tau is
new tokens per target forward (counting the bonus token; plain decoding = 1.0) and the accept rate
is accepted drafts / drafts the target verified.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .bench_report import plot_results, print_table, summarise
from .cli_args import (
    DTYPES,
    check_choice,
    command_line,
    domains_field,
    drafter_field,
    dtype_field,
    encode_prompt,
    eval_prompts_field,
    json_field,
    num_threads_field,
    target_field,
)
from .provenance import code_provenance
from .targets import DEFAULT_TARGET

logger = logging.getLogger(__name__)

METHODS = (
    "target",
    "target-stock",
    "adaflash",
    "adaflash-chain",
    "adaflash-drafter",
    "adaflash-suffix",
    "adaflash-global",
    "adaflash-datastore",
    "prompt-lookup",
    "assisted",
    "dflash-builtin",
)
POSITIONS = 16  # draft positions whose acceptance is recorded (covers the block and suffix matches)
SOURCE_OF = {
    "adaflash-drafter": "drafter",
    "adaflash-suffix": "suffix",
    "adaflash-global": "global",
    "adaflash-datastore": "datastore",
}
ASSISTANT_FOR = {"qwen2.5-coder-1.5b": "qwen2.5-coder-0.5b"}


@dataclass
class BenchArgs:
    target: str = target_field(DEFAULT_TARGET)
    drafter: str = drafter_field()
    prompts: str = eval_prompts_field()
    domains: str = domains_field("code,math,chat,news")
    num_prompts: int = field(default=4, metadata={"help": "Prompts per domain (preset eval set) or in total (JSONL)."})
    methods: str = field(
        default="target,adaflash,prompt-lookup,dflash-builtin",
        metadata={"help": f"Comma-separated subset of {','.join(METHODS)}."},
    )
    assistant: str = field(
        default="auto", metadata={"help": "Draft model for 'assisted' ('auto': the preset's smaller sibling)."}
    )
    max_new_tokens: int = field(default=128, metadata={"help": "New tokens per prompt."})
    verify_len: int | None = field(
        default=None,
        metadata={
            "help": (
                "adaflash methods: tokens verified per round (anchor + drafts), at most the longest proposal; "
                "default: the goodput policy. 'adaflash@N' in --methods sets it per entry, to compare lengths "
                "side by side."
            )
        },
    )
    num_threads: int | None = num_threads_field("; recorded in the JSON")
    dtype: str = dtype_field()
    json: str = json_field("bench.json")
    plot: str = field(
        default="bench.png",
        metadata={"help": "Where to write the speed-up and per-position acceptance plot ('' to skip)."},
    )
    concurrency: str = field(
        default="",
        metadata={
            "help": (
                "Serve the engine over HTTP and keep this many requests in flight, e.g. 1,4,8,16,32: a "
                "throughput benchmark of continuous batching whose methods are plain, adaflash@N and adaflash "
                "(default: plain,adaflash@16,adaflash@4,adaflash)."
            )
        },
    )
    requests: int = field(
        default=0,
        metadata={"help": "With --concurrency: requests per method and level (0: twice the concurrency, at least 16)."},
    )
    repeats: int = field(
        default=1,
        metadata={
            "help": (
                "With --concurrency: measured passes per method and level, the methods interleaved in each "
                "(throughput: all passes' tokens over their time; latencies pooled); 2 or more add bootstrap "
                "95 % intervals over the passes, paired by pass (a claim on a 2-core machine needs 5+)."
            )
        },
    )
    round_log: str = field(
        default="",
        metadata={
            "help": (
                "With --concurrency: a JSONL file to write every round of the adaptive method to, as its "
                "throughput guard sees it, for benchmarks/profile/guard_replay.py ('' to skip)."
            )
        },
    )
    quality: bool = field(
        default=False,
        metadata={
            "help": (
                "Task results instead of speed: GSM8K exact match and HumanEval pass@1 of the target decoded "
                "plainly and with AdaFlash (greedy, same held-out problems and batches), with token-identical "
                "outputs and a paired McNemar test, to show that bf16 near-ties leave results unchanged. Uses "
                "--target, --drafter, --dtype, --num-threads and --json."
            )
        },
    )
    quality_problems: int = field(
        default=40,
        metadata={
            "help": (
                "With --quality: held-out problems per task (the eval splits hold 40 GSM8K and 30 HumanEval problems)."
            )
        },
    )
    quality_max_new_tokens: int = field(
        default=512,
        metadata={
            "help": "With --quality: new tokens per answer (reasoning and code need more than --max-new-tokens)."
        },
    )

    def __post_init__(self):
        if self.quality:
            if self.concurrency:
                raise ValueError("--quality and --concurrency are separate benchmarks: pass one of them.")
            self.quality_args()  # validates the quality check's own settings
            return
        if self.concurrency:
            self.serving_args()  # validates the concurrency benchmark's own methods and levels
            return
        if self.round_log:
            raise ValueError("--round-log logs the rounds of served requests: it needs --concurrency.")
        unknown = {m for m in self.method_list if m.partition("@")[0] not in METHODS}
        if unknown:
            raise ValueError(f"unknown methods {sorted(unknown)}; choose from {', '.join(METHODS)} (or adaflash@N).")
        for m in self.method_list:
            base, _, arg = m.partition("@")
            if arg and (not base.startswith("adaflash") or not arg.isdigit() or int(arg) < 1):
                raise ValueError(f"method {m!r}: only adaflash methods take a verify length N >= 1 (e.g. adaflash@4).")
        if len(set(self.method_list)) != len(self.method_list):
            raise ValueError(f"--methods lists a method twice: {self.methods!r}.")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"--num-threads must be >= 1, got {self.num_threads}.")
        if "target" not in self.method_list:
            raise ValueError("--methods must include 'target': speed-ups and output equality are relative to it.")
        if self.max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens {self.max_new_tokens}: ask for at least 1 new token.")
        if self.num_prompts < 1:
            raise ValueError(f"--num-prompts {self.num_prompts}: must be >= 1.")
        if self.verify_len is not None and self.verify_len < 1:
            raise ValueError(f"--verify-len {self.verify_len}: must be >= 1 (the anchor plus any drafts), or unset.")
        check_choice("--dtype", self.dtype, DTYPES)
        if self.prompts != "eval" and not Path(self.prompts).is_file():
            raise FileNotFoundError(
                f"--prompts {self.prompts}: no such file; give 'eval' (the held-out preset prompts) "
                "or a JSONL file of {prompt, domain} lines."
            )

    def serving_args(self):
        """The :class:`~adaflash_hf.serving.loadtest.ConcurrencyBenchArgs` for ``--concurrency``."""
        from .serving.loadtest import ConcurrencyBenchArgs

        methods = self.methods if self.methods != BenchArgs.methods else ConcurrencyBenchArgs.methods
        return ConcurrencyBenchArgs(
            target=self.target,
            drafter=self.drafter,
            concurrency=self.concurrency,
            methods=methods,
            requests=self.requests,
            repeats=self.repeats,
            prompts=self.prompts,
            max_new_tokens=self.max_new_tokens,
            domains=self.domains,
            dtype=self.dtype,
            num_threads=self.num_threads,
            json=self.json,
            plot=self.plot,
            round_log=self.round_log,
        )

    def quality_args(self):
        """The :class:`~adaflash_hf.quality.command.QualityArgs` for ``--quality``."""
        from .quality.command import QualityArgs

        return QualityArgs(
            target=self.target,
            drafter=self.drafter,
            problems=self.quality_problems,
            max_new_tokens=self.quality_max_new_tokens,
            dtype=self.dtype,
            num_threads=self.num_threads,
            json=self.json,
        )

    @property
    def method_list(self) -> list[str]:
        return [m.strip() for m in self.methods.split(",") if m.strip()]


class ForwardCounter:
    """Counts the target's forward passes and the drafts each verified (a forward pre-hook)."""

    def __init__(self, model, prompt_len: int):
        self.calls, self.drafts, self.prompt_len = 0, 0, prompt_len
        self.handle = model.register_forward_pre_hook(self.hook, with_kwargs=True)

    def hook(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        length = ids.shape[1]
        self.drafts += length - self.prompt_len if self.calls == 0 else length - 1
        self.calls += 1

    def close(self):
        self.handle.remove()


def load_bench_prompts(args: BenchArgs) -> list[dict]:
    try:
        import datasets  # noqa: F401
    except ImportError as error:
        raise ImportError(
            "adaflash bench and profile read prompt sets with `datasets`: pip install 'adaflash-hf[train]'"
        ) from error
    from .data import benchmark_prompts

    return benchmark_prompts(args.prompts, args.domains, args.num_prompts)


def run_bench(args: BenchArgs) -> int:
    if args.quality:
        from .quality.command import run_quality

        return run_quality(args.quality_args(), command=command_line("bench", args))
    if args.concurrency:
        from .serving.loadtest import run_concurrency_bench

        return run_concurrency_bench(args.serving_args())
    import torch

    from . import (
        DraftingConfig,
        DraftingState,
        FixedVerifyLength,
        GoodputVerifyLength,
        enable_adaflash,
        generate,
        load_target,
    )
    from .checks import check_verify_len
    from .drafters import load_drafter
    from .kernels import stock_linear

    if args.num_threads is not None:
        torch.set_num_threads(args.num_threads)
    target, tokenizer = load_target(args.target, dtype=args.dtype)
    methods = args.method_list
    bases = {m.partition("@")[0] for m in methods}
    needs_drafter = {"adaflash", "adaflash-chain", "adaflash-drafter", "adaflash-datastore", "dflash-builtin"} & bases
    drafter = load_drafter(args.drafter, target, target_name=args.target) if needs_drafter else None
    assistant = None
    if "assisted" in bases:
        name = ASSISTANT_FOR.get(args.target) if args.assistant == "auto" else args.assistant
        if name is None:
            raise ValueError(
                f"no default draft model for {args.target}; pass --assistant or drop 'assisted' from --methods."
            )
        assistant, _ = load_target(name, dtype=args.dtype)
    # Each adaflash method learns across prompts (acceptance rates, verify cost, the global index of
    # earlier requests) in its own state, so no method sees another's outputs.
    states = {m: DraftingState() for m in methods if m.startswith("adaflash")}
    draftings, policies = {}, {}
    for m in states:
        base, _, verify_arg = m.partition("@")
        draftings[m] = (
            DraftingConfig.only(SOURCE_OF[base])
            if base in SOURCE_OF
            else DraftingConfig(tree_nodes=0)
            if base == "adaflash-chain"
            else DraftingConfig()
        )
        verify_len = int(verify_arg) if verify_arg else args.verify_len
        if verify_len:
            check_verify_len(verify_len, drafter, draftings[m])
        policies[m] = FixedVerifyLength(verify_len) if verify_len else GoodputVerifyLength()

    enable_adaflash(target)
    prompts = load_bench_prompts(args)
    pad = tokenizer.pad_token_id
    common = dict(max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=pad)

    def run(method: str, ids: torch.Tensor):
        mask = torch.ones_like(ids)
        if method == "target":
            return target.generate(ids, attention_mask=mask, **common)[0], None
        if method == "target-stock":  # the same plain decoding through torch's stock linear kernels
            with stock_linear(target):
                return target.generate(ids, attention_mask=mask, **common)[0], None
        if method.startswith("adaflash"):
            out = generate(
                target,
                drafter,
                ids,
                mask,
                max_new_tokens=args.max_new_tokens,
                do_sample=False,
                pad_token_id=pad,
                verify_policy=policies[method],
                drafting=draftings[method],
                drafting_state=states[method],
            )
            return out.sequences[0, : ids.shape[1] + out.num_new_tokens[0]], out.stats
        if method == "prompt-lookup":
            return target.generate(ids, attention_mask=mask, prompt_lookup_num_tokens=10, **common)[0], None
        if method == "assisted":
            return target.generate(ids, attention_mask=mask, assistant_model=assistant, **common)[0], None
        return target.generate(ids, attention_mask=mask, assistant_model=drafter, speculation_type="dflash", **common)[
            0
        ], None

    warm = encode_prompt(tokenizer, "Hello!")
    for method in methods:  # warm-up: first calls pay one-off costs
        run(method, warm)

    records = []
    print(
        f"[bench] {len(prompts)} prompts x {len(methods)} methods, {args.max_new_tokens} new tokens, {target.dtype}",
        file=sys.stderr,
    )
    for i, item in enumerate(prompts):
        ids = encode_prompt(tokenizer, item["prompt"]).to(target.device)
        reference = None
        for method in methods:
            counter = ForwardCounter(target, ids.shape[1])
            start = time.perf_counter()
            with torch.inference_mode():
                sequence, stats = run(method, ids)
            seconds = time.perf_counter() - start
            counter.close()
            new = sequence[ids.shape[1] :].tolist()
            if method == "target":
                reference = new
            records.append(
                dict(
                    method=method,
                    domain=item["domain"],
                    prompt=i,
                    new_tokens=len(new),
                    seconds=seconds,
                    forwards=counter.calls,
                    drafts=counter.drafts,
                    same=new == reference,
                    positions=stats.position_counts(POSITIONS) if stats else None,
                    sources=stats.source_counts() if stats else None,
                )
            )
        done = [r for r in records if r["prompt"] == i]
        print(
            f"[bench] prompt {i + 1}/{len(prompts)} ({item['domain']}): "
            + ", ".join(f"{r['method']} {r['new_tokens'] / r['seconds']:.1f} tok/s" for r in done),
            file=sys.stderr,
        )

    results = summarise(records, methods)
    print_table(results)
    payload = {
        "command": command_line("bench", args),
        "args": asdict(args),
        "device": str(target.device),
        "dtype": str(target.dtype),
        "torch_threads": torch.get_num_threads(),
        "code": code_provenance(),
        "results": results,
        "records": records,
    }
    Path(args.json).write_text(json.dumps(payload, indent=2))
    print(f"[bench] wrote {args.json}", file=sys.stderr)
    if args.plot:
        plot_results(records, results, args.plot)
        print(f"[bench] wrote {args.plot}", file=sys.stderr)
    return 0
