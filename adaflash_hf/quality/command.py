"""The ``adaflash bench --quality`` command: both methods decode the same problems, then the paired report.

Both methods decode greedily the same batches of chat prompts (DFlash's benchmark formats): ``target``
is ``target.generate``, ``adaflash`` the batched engine with its default drafting. The report gives
each method's score with a Wilson interval, how many outputs are token-identical, the exact McNemar
p-value of the paired results and Newcombe's interval for the paired difference, so "within noise"
is a number rather than a judgement.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..cli_args import DTYPES, check_choice, drafter_field, dtype_field, json_field, num_threads_field, target_field
from ..targets import DEFAULT_TARGET
from .problems import METRIC_OF, TASKS, Problem, load_problems, score
from .stats import mcnemar_exact_p, paired_difference_interval, wilson_interval

METHODS = ("target", "adaflash")


@dataclass
class QualityArgs:
    target: str = target_field(DEFAULT_TARGET)
    drafter: str = drafter_field()
    problems: int = field(
        default=40,
        metadata={
            "help": (
                "Problems per task: held-out eval prompts first (40 GSM8K, 30 HumanEval), then the rest of the "
                "benchmark (see load_problems)."
            )
        },
    )
    max_new_tokens: int = field(
        default=512, metadata={"help": "New tokens per answer; a cut-off answer is scored as it stands."}
    )
    batch_size: int = field(
        default=8, metadata={"help": "Problems decoded together (both methods see the same batches)."}
    )
    timeout_s: float = field(default=10.0, metadata={"help": "Wall-clock limit of one HumanEval program, in seconds."})
    dtype: str = dtype_field()
    num_threads: int | None = num_threads_field()
    json: str = json_field("quality.json", "the summary and per-problem records")

    def __post_init__(self):
        if self.problems < 1 or self.max_new_tokens < 1 or self.batch_size < 1:
            raise ValueError(
                f"problems ({self.problems}), max_new_tokens ({self.max_new_tokens}) and batch_size "
                f"({self.batch_size}) must each be >= 1."
            )
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}.")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {self.num_threads}.")
        check_choice("--dtype", self.dtype, DTYPES)


# ---------------------------------------------------------------------------------------------
# The paired report
# ---------------------------------------------------------------------------------------------


def summarise(records: list[dict]) -> list[dict]:
    """Per task and overall: each method's score, identical outputs, and the paired comparison."""
    results = []
    for task in [t for t in TASKS if any(r["task"] == t for r in records)] + ["all"]:
        group = [r for r in records if task in ("all", r["task"])]
        n = len(group)
        plain, ours = ([r["correct"][m] for r in group] for m in METHODS)
        both = sum(p and o for p, o in zip(plain, ours))
        target_only = sum(p and not o for p, o in zip(plain, ours))
        adaflash_only = sum(o and not p for p, o in zip(plain, ours))
        low, high = paired_difference_interval(both, adaflash_only, target_only, n - both - target_only - adaflash_only)
        results.append(
            dict(
                task=task,
                metric=METRIC_OF.get(task, "solved"),
                problems=n,
                identical_outputs=sum(r["identical"] for r in group),
                score={m: round(sum(r["correct"][m] for r in group) / n, 4) for m in METHODS},
                score_ci95={
                    m: [round(v, 4) for v in wilson_interval(sum(r["correct"][m] for r in group), n)] for m in METHODS
                },
                only_target_correct=target_only,
                only_adaflash_correct=adaflash_only,
                difference=round((adaflash_only - target_only) / n, 4),
                difference_ci95=[round(low, 4), round(high, 4)],
                mcnemar_p=round(mcnemar_exact_p(target_only, adaflash_only), 4),
                new_tokens={m: sum(r["new_tokens"][m] for r in group) for m in METHODS},
            )
        )
    return results


def print_table(results: list[dict]) -> None:
    header = (
        f"{'task':<10} {'metric':<12} {'problems':>8} {'identical':>9}  {'target [95% CI]':<21} "
        f"{'adaflash [95% CI]':<21} {'adaflash - target [95% CI]':<27} {'McNemar p':>9}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        scores = [f"{r['score'][m]:.3f} [{r['score_ci95'][m][0]:.2f}, {r['score_ci95'][m][1]:.2f}]" for m in METHODS]
        low, high = r["difference_ci95"]
        difference = f"{r['difference']:+.3f} [{low:+.2f}, {high:+.2f}]"
        print(
            f"{r['task']:<10} {r['metric']:<12} {r['problems']:>8} {r['identical_outputs']:>5}/{r['problems']:<3}  "
            f"{scores[0]:<21} {scores[1]:<21} {difference:<27} {r['mcnemar_p']:>9.3f}"
        )


# ---------------------------------------------------------------------------------------------
# Generation and the command
# ---------------------------------------------------------------------------------------------


def until_stop(tokens: list[int], stop_ids: frozenset[int]) -> list[int]:
    """``tokens`` up to and including the first stop token (padding after it dropped)."""
    for i, token in enumerate(tokens):
        if token in stop_ids:
            return tokens[: i + 1]
    return tokens


def decode_batch(
    method: str,
    target,
    drafter,
    prompts: list[list[int]],
    max_new_tokens: int,
    pad_id: int,
    stop_ids: frozenset[int],
    drafting_state=None,
) -> list[list[int]]:
    """Greedy new token ids per prompt (through the first stop token) with ``method``, one batch of left-padded
    prompts."""
    import torch

    from ..decoding.engine import generate

    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt) :] = torch.tensor(prompt)
        attention_mask[row, width - len(prompt) :] = 1
    input_ids, attention_mask = input_ids.to(target.device), attention_mask.to(target.device)
    with torch.inference_mode():
        if method == "target":
            sequences = target.generate(
                input_ids,
                attention_mask=attention_mask,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=pad_id,
            )
            rows = sequences[:, width:].tolist()
        else:
            out = generate(
                target,
                drafter,
                input_ids,
                attention_mask,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=pad_id,
                drafting_state=drafting_state,
            )
            rows = [out.sequences[row, width : width + n].tolist() for row, n in enumerate(out.num_new_tokens)]
    return [until_stop(r, stop_ids) for r in rows]


def evaluate(
    target, tokenizer, drafter, problems: list[Problem], args: QualityArgs
) -> tuple[list[dict], dict[str, float]]:
    """Decode every problem with both methods (same batches, methods alternating) and score the answers.

    Returns one record per problem (in ``problems``' order when it is grouped by task, as
    :func:`load_problems` gives it) and the seconds each method spent generating.
    """
    import torch

    from ..decoding.drafting_state import DraftingState
    from ..prompting import chat_prompt_ids

    eos = target.generation_config.eos_token_id
    stop_ids = frozenset(torch.tensor(eos).flatten().tolist()) if eos is not None else frozenset()
    pad_id = tokenizer.pad_token_id
    state = DraftingState()  # AdaFlash learns across batches, as it would across requests
    seconds = dict.fromkeys(METHODS, 0.0)
    records = []
    batches = []  # per task: its answers have similar lengths, and a batch lasts as long as its longest answer
    for task in dict.fromkeys(p.task for p in problems):
        same = [p for p in problems if p.task == task]
        batches += [same[i : i + args.batch_size] for i in range(0, len(same), args.batch_size)]
    for index, batch in enumerate(batches):
        prompts = [chat_prompt_ids(tokenizer, p.prompt) for p in batch]
        outputs = {}
        for method in METHODS:
            start = time.perf_counter()
            outputs[method] = decode_batch(
                method, target, drafter, prompts, args.max_new_tokens, pad_id, stop_ids, state
            )
            seconds[method] += time.perf_counter() - start
        for row, problem in enumerate(batch):
            texts = {m: tokenizer.decode(outputs[m][row], skip_special_tokens=True) for m in METHODS}
            scores = {m: score(problem, texts[m], args.timeout_s) for m in METHODS}
            records.append(
                dict(
                    id=problem.id,
                    task=problem.task,
                    split=problem.split,
                    correct={m: scores[m].correct for m in METHODS},
                    identical=outputs["target"][row] == outputs["adaflash"][row],
                    new_tokens={m: len(outputs[m][row]) for m in METHODS},
                    details={m: scores[m].detail for m in METHODS},
                    reference=problem.answer or None,
                    outputs=texts,
                )
            )
        done = records[-len(batch) :]
        print(
            f"[quality] batch {index + 1}/{len(batches)} ({batch[0].task}): "
            + ", ".join(f"{m} {sum(r['correct'][m] for r in done)}/{len(done)} correct" for m in METHODS)
            + f", {sum(r['identical'] for r in done)}/{len(done)} identical; "
            + ", ".join(f"{m} {sum(r['new_tokens'][m] for r in done)} tokens" for m in METHODS),
            file=sys.stderr,
        )
    return records, seconds


def run_quality(args: QualityArgs, command: str | None = None) -> int:
    """The ``adaflash bench --quality`` command: prints the table and writes ``args.json``; ``command`` is recorded."""
    import torch

    from ..drafters import load_drafter
    from ..provenance import code_provenance
    from ..targets import load_target

    if args.num_threads is not None:
        torch.set_num_threads(args.num_threads)
    problems = [p for task in TASKS for p in load_problems(task, args.problems)]
    target, tokenizer = load_target(args.target, dtype=args.dtype)
    drafter = load_drafter(args.drafter, target, target_name=args.target)
    print(
        f"[quality] {len(problems)} problems "
        f"({', '.join(f'{t} {sum(p.task == t for p in problems)}' for t in TASKS)}), "
        f"batches of {args.batch_size}, {args.max_new_tokens} new tokens, {target.dtype}, {torch.get_num_threads()} "
        f"threads",
        file=sys.stderr,
    )
    records, seconds = evaluate(target, tokenizer, drafter, problems, args)
    results = summarise(records)
    print_table(results)
    tokens = results[-1]["new_tokens"]
    generation = {
        m: dict(new_tokens=tokens[m], seconds=round(seconds[m], 2), tokens_per_second=round(tokens[m] / seconds[m], 3))
        for m in METHODS
    }
    print(
        "[quality] generation: " + ", ".join(f"{m} {tokens[m]} tokens in {seconds[m]:.0f} s" for m in METHODS),
        file=sys.stderr,
    )
    payload = {
        "command": command,
        "args": asdict(args),
        "device": str(target.device),
        "dtype": str(target.dtype),
        "torch_threads": torch.get_num_threads(),
        "code": code_provenance(),
        "generation": generation,
        "results": results,
        "records": records,
    }
    Path(args.json).write_text(json.dumps(payload, indent=2))
    print(f"[quality] wrote {args.json}", file=sys.stderr)
    return 0
