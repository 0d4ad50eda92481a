"""``adaflash profile``: where the time of one speculative round goes, against one plain decode step.

Measured in one process, on held-out prompts, batch 1, greedy:
- the target's forward with k new tokens (k = 1 is a plain decode step; k > 1 is a verification),
  at the cache length of a typical answer, median of repeated calls;
- transformers' own ``generate`` per token (the plain baseline, with its loop overhead);
- our engine per round, split into the drafter pass (block forward + draft head), the suffix and
  datastore look-ups, the verification forward (with accept), and the rest (cache bookkeeping,
  statistics, Python), from the engine's own per-round timings.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

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
from .targets import DEFAULT_TARGET

if TYPE_CHECKING:
    import torch


@dataclass
class ProfileArgs:
    target: str = target_field(DEFAULT_TARGET)
    drafter: str = drafter_field()
    dtype: str = dtype_field()
    prompts: str = eval_prompts_field()
    domains: str = domains_field("code,math,chat")
    num_prompts: int = field(default=2, metadata={"help": "Prompts per domain (preset eval set) or in total (JSONL)."})
    max_new_tokens: int = field(default=96, metadata={"help": "New tokens per prompt."})
    num_threads: int | None = num_threads_field()
    json: str = json_field("profile.json")

    def __post_init__(self):
        if self.num_prompts < 1:
            raise ValueError(f"--num-prompts {self.num_prompts}: must be >= 1.")
        if self.max_new_tokens < 8:
            raise ValueError(f"--max-new-tokens {self.max_new_tokens}: profile needs at least 8 new tokens per prompt.")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"--num-threads must be >= 1, got {self.num_threads}.")
        check_choice("--dtype", self.dtype, DTYPES)
        if self.prompts != "eval" and not Path(self.prompts).is_file():
            raise FileNotFoundError(
                f"--prompts {self.prompts}: no such file; give 'eval' (the held-out preset prompts) "
                "or a JSONL file of {prompt, domain} lines."
            )


def forward_ms(target, input_ids: torch.Tensor, ks=(1, 2, 4, 8, 16), repeats: int = 9) -> dict[int, float]:
    """Median milliseconds of one cached target forward with k new tokens after ``input_ids``."""
    import torch

    from ._compat import CACHE_KWARG, engine_attention
    from .decoding.kv_cache import RaggedCache

    cache = RaggedCache()  # the engine's cache: timings include what its updates cost
    with torch.inference_mode():
        target(input_ids=input_ids, use_cache=True, **{CACHE_KWARG: cache})
        result = {}
        for k in ks:
            new = input_ids[:, -k:] if k <= input_ids.shape[1] else input_ids[:, -1:].repeat(1, k)
            times = []
            for _ in range(repeats + 2):
                start = time.perf_counter()
                with engine_attention(new.device, k):  # as the engine's forwards attend
                    target(input_ids=new, use_cache=True, **{CACHE_KWARG: cache})
                times.append(time.perf_counter() - start)
                cache.crop(-k)
            result[k] = round(statistics.median(times[2:]) * 1e3, 2)
    return result


def new_totals() -> dict:
    """Summed engine timings (seconds) and counts over generations, as :func:`timed_generate` adds them."""
    return dict(wall=0.0, prefill=0.0, draft=0.0, verify=0.0, rounds=0, tokens=0)


def timed_generate(total: dict, target, drafter, ids, max_new_tokens: int, **kwargs) -> None:
    """One batch-1 generation through the engine; its wall time and the engine's own per-phase timings are added
    to ``total`` (see :func:`new_totals`)."""
    from . import generate

    start = time.perf_counter()
    out = generate(target, drafter, ids, max_new_tokens=max_new_tokens, **kwargs)
    total["wall"] += time.perf_counter() - start
    total["prefill"] += out.stats.prefill_time
    total["draft"] += out.stats.draft_time
    total["verify"] += out.stats.verify_time
    total["rounds"] += out.stats.num_rounds
    total["tokens"] += out.num_new_tokens[0]


def timed_plain_generate(target, ids, max_new_tokens: int, pad_token_id: int | None) -> tuple[float, int]:
    """Seconds and new tokens of one greedy batch-1 ``target.generate`` (transformers' own loop: the plain baseline)."""
    import torch

    start = time.perf_counter()
    out = target.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=pad_token_id,
    )
    return time.perf_counter() - start, out.shape[1] - ids.shape[1]


def run_profile(args: ProfileArgs) -> int:
    import torch

    from . import DraftingConfig, DraftingState, FixedVerifyLength, generate, load_target
    from .bench import load_bench_prompts
    from .drafters import load_drafter
    from .provenance import code_provenance

    if args.num_threads is not None:
        torch.set_num_threads(args.num_threads)
    target, tokenizer = load_target(args.target, dtype=args.dtype)
    drafter = load_drafter(args.drafter, target, target_name=args.target)
    prompts = [encode_prompt(tokenizer, item["prompt"]).to(target.device) for item in load_bench_prompts(args)]
    pad = tokenizer.pad_token_id
    warm = encode_prompt(tokenizer, "Hi!")
    configs = {
        "drafter block only (whole block)": dict(
            drafting=DraftingConfig.only("drafter"), verify_policy=FixedVerifyLength()
        ),
        "suffix matches only": dict(drafting=DraftingConfig.only("suffix")),
        "hybrid (default)": dict(drafting=DraftingConfig()),
    }
    for kwargs in configs.values():  # first calls pay one-off costs
        generate(target, drafter, warm, max_new_tokens=8, drafting_state=DraftingState(), **kwargs)
    target.generate(warm, attention_mask=torch.ones_like(warm), max_new_tokens=8, do_sample=False, pad_token_id=pad)

    plain_s, plain_tokens = 0.0, 0
    rows = {}
    for name, kwargs in configs.items():
        state = DraftingState()
        total = new_totals()
        for ids in prompts:
            timed_generate(total, target, drafter, ids, args.max_new_tokens, drafting_state=state, **kwargs)
        rounds = total["rounds"]
        rows[name] = {
            "rounds": rounds,
            "tokens_per_round": round(total["tokens"] / (rounds + len(prompts)), 3),
            "propose_ms": round(total["draft"] / rounds * 1e3, 2),
            "verify_ms": round(total["verify"] / rounds * 1e3, 2),
            "other_ms": round((total["wall"] - total["prefill"] - total["draft"] - total["verify"]) / rounds * 1e3, 2),
            "round_ms": round((total["wall"] - total["prefill"]) / rounds * 1e3, 2),
            "tokens_per_second": round(total["tokens"] / total["wall"], 2),
        }
    for ids in prompts:
        seconds, tokens = timed_plain_generate(target, ids, args.max_new_tokens, pad)
        plain_s, plain_tokens = plain_s + seconds, plain_tokens + tokens
    step_ms = plain_s / plain_tokens * 1e3
    context = torch.cat(prompts, dim=1)[:, :256]
    forwards = forward_ms(target, context)

    print(f"plain decoding (transformers generate): {step_ms:.2f} ms per token, {plain_tokens / plain_s:.2f} tok/s")
    print(
        f"target forward with k new tokens (cache ~{context.shape[1]} tokens): "
        + ", ".join(f"k={k}: {ms:.1f} ms ({ms / forwards[1]:.2f}x)" for k, ms in forwards.items())
    )
    header = (
        f"{'engine configuration':<34} {'round ms':>9} {'propose':>8} {'verify':>8} {'other':>7} "
        f"{'tok/round':>10} {'tok/s':>7} {'vs plain':>9}"
    )
    print(header)
    print("-" * len(header))
    for name, r in rows.items():
        print(
            f"{name:<34} {r['round_ms']:>9.2f} {r['propose_ms']:>8.2f} {r['verify_ms']:>8.2f} {r['other_ms']:>7.2f} "
            f"{r['tokens_per_round']:>10.2f} {r['tokens_per_second']:>7.2f} {r['round_ms'] / step_ms:>8.2f}x"
        )
    payload = {
        "command": command_line("profile", args),
        "args": asdict(args),
        "dtype": str(target.dtype),
        "torch_threads": torch.get_num_threads(),
        "code": code_provenance(),
        "plain_ms_per_token": round(step_ms, 2),
        "forward_ms_by_new_tokens": forwards,
        "engine": rows,
    }
    Path(args.json).write_text(json.dumps(payload, indent=2))
    print(f"[profile] wrote {args.json}", file=sys.stderr)
    return 0
