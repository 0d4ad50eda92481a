"""A held round of the adaptive engine against the plain engine's batched step, in one process, interleaved.

When the verify-length policy holds drafting (every row verifies only its anchor), a round should cost what a plain
step costs. This script builds both engines the way ``adaflash bench --concurrency`` serves them (``plain`` and the
adaptive ``adaflash``, :func:`adaflash_hf.serving.loadtest.make_scheduler`), forces the adaptive policy to hold (its
own bookkeeping still runs), gives both the same prompts at each batch size and times their rounds alternately, the
order flipped every round. It prints the median milliseconds of each and their ratio (held / plain; 1.00 is the goal)
and writes JSON with its provenance::

    python benchmarks/profile/held_round.py --num-threads 2 --json held_round.json

Any target works: a preset (default ``smollm2-135m``) or a local folder with its drafter folder.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass, field

from adaflash_hf.cli_args import (
    DTYPES,
    add_dataclass_arguments,
    check_choice,
    dataclass_from_args,
    drafter_field,
    dtype_field,
    num_threads_field,
    target_field,
)


@dataclass
class HeldRoundArgs:
    target: str = target_field("smollm2-135m")
    drafter: str = drafter_field()
    dtype: str = dtype_field()
    batch_sizes: str = field(default="1,4,8,16", metadata={"help": "Comma-separated numbers of rows."})
    rounds: int = field(default=40, metadata={"help": "Timed rounds of each engine per batch size."})
    warmup: int = field(default=5, metadata={"help": "Untimed rounds of each engine per batch size first."})
    prompt_tokens: int = field(default=128, metadata={"help": "Tokens of every row's prompt (seeded random ids)."})
    num_threads: int | None = num_threads_field()
    json: str = field(default="held_round.json", metadata={"help": "Where to write the results ('' to skip)."})
    machine_note: str = field(default="", metadata={"help": "Appended to the machine in the provenance, e.g. 'idle'."})

    def __post_init__(self):
        sizes = self.sizes
        if not sizes or min(sizes) < 1:
            raise ValueError(f"--batch-sizes {self.batch_sizes!r}: give positive integers, e.g. 1,4,8,16.")
        if self.rounds < 1 or self.warmup < 0 or self.prompt_tokens < 1:
            raise ValueError("--rounds and --prompt-tokens must be >= 1 and --warmup >= 0.")
        check_choice("--dtype", self.dtype, DTYPES)

    @property
    def sizes(self) -> list[int]:
        try:
            return [int(s) for s in self.batch_sizes.split(",") if s.strip()]
        except ValueError:
            return []


def hold_drafting(policy) -> None:
    """Make ``policy`` hold drafting every round; its own answer is still asked, so its bookkeeping runs as in a round
    it holds by itself."""
    ask = policy.wants_drafts

    def wants_drafts(rows: int) -> bool:
        ask(rows)
        return False

    policy.wants_drafts = wants_drafts


def measure(plain, held, prompts: list[list[int]], args: HeldRoundArgs, device) -> dict:
    """Median seconds of ``plain``'s and ``held``'s rounds over the same rows, timed alternately."""
    from adaflash_hf.decoding.cost import timer
    from adaflash_hf.decoding.state import RowSpec

    budget = args.warmup + args.rounds + 1  # no row finishes while timed
    for batch in (plain, held):
        batch.add_rows([RowSpec(i, p, budget) for i, p in enumerate(prompts)])
        for _ in range(args.warmup):
            batch.step()
    seconds: dict[str, list[float]] = {"plain": [], "held": []}
    for round_index in range(args.rounds):
        order = (("plain", plain), ("held", held))
        for name, batch in order if round_index % 2 == 0 else order[::-1]:
            start = timer(device)
            updates = batch.step()
            seconds[name].append(timer(device) - start)
            if any(len(u.tokens) != 1 or u.source != "none" for u in updates):
                raise RuntimeError(f"the {name} engine drafted in a round meant to hold: its timing would not compare.")
    plain_s, held_s = statistics.median(seconds["plain"]), statistics.median(seconds["held"])
    return {
        "batch_size": len(prompts),
        "plain_ms": round(1000 * plain_s, 4),
        "held_ms": round(1000 * held_s, 4),
        "held_vs_plain": round(held_s / plain_s, 4),
        "rounds": args.rounds,
    }


def print_table(rows: list[dict]) -> None:
    header = f"{'rows':>4} {'plain ms':>9} {'held ms':>9} {'held/plain':>10}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['batch_size']:>4} {r['plain_ms']:>9.3f} {r['held_ms']:>9.3f} {r['held_vs_plain']:>10.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_dataclass_arguments(parser, HeldRoundArgs)
    try:
        args = dataclass_from_args(HeldRoundArgs, parser.parse_args(argv))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    import torch

    from adaflash_hf import load_target
    from adaflash_hf.drafters import load_drafter
    from adaflash_hf.provenance import write_script_json
    from adaflash_hf.serving.loadtest import make_scheduler

    if args.num_threads is not None:
        torch.set_num_threads(args.num_threads)
    target, tokenizer = load_target(args.target, dtype=args.dtype)
    drafter = load_drafter(args.drafter, target, target_name=args.target)
    vocab = target.get_input_embeddings().weight.shape[0]
    special = set(tokenizer.all_special_ids)
    generator = torch.Generator().manual_seed(0)
    rows = []
    with torch.inference_mode():
        for size in args.sizes:
            prompts = [
                [
                    t
                    for t in torch.randint(0, vocab, (2 * args.prompt_tokens,), generator=generator).tolist()
                    if t not in special
                ][: args.prompt_tokens]
                for _ in range(size)
            ]
            plain = make_scheduler("plain", target, None, tokenizer, size).batch
            adaptive = make_scheduler("adaflash", target, drafter, tokenizer, size, target_name=args.target).batch
            hold_drafting(adaptive.policy)
            rows.append(measure(plain, adaptive, prompts, args, target.device))
    print_table(rows)
    if args.json:
        write_script_json("benchmarks/profile/held_round.py", argv, args, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
