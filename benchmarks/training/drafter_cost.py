"""What a drafter's depth and block size cost per round on this CPU, and the τ each would need to pay.

Each configuration is the drafter (default: the bundled one) grown by identity layers (``grow_drafter``: their
output projections are zero, so at the drafter's own block size every depth proposes exactly what it proposes and
the rounds are the same) and, for other block sizes, the same weights with a longer or shorter block. Each runs
the engine's drafter-alone path (``DraftingConfig.only("drafter")``, drafting every round and verifying the whole
block) on held-out prompts, and the engine's own per-round timings give the drafter pass and the verification. The
configurations alternate within each pass, so machine noise hits them alike; plain decoding (transformers'
``generate``) is timed on the same prompts in every pass.

A round that costs ``c`` plain decoding steps runs at ``τ / c`` times plain for a drafter that reaches τ tokens
per round, so the table gives the τ each configuration needs to break even, to match the drafter as it is at
``--reference-tau``, and to make 2× plain. Run on an idle machine::

    python benchmarks/training/drafter_cost.py --num-threads 2 --json benchmarks/training/drafter_cost.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

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
class DrafterCostArgs:
    target: str = target_field("smollm2-135m")
    drafter: str = drafter_field()
    dtype: str = dtype_field()
    layers: str = field(default="1,2,3,5", metadata={"help": "Comma-separated depths (at least the drafter's)."})
    blocks: str = field(default="8,16", metadata={"help": "Comma-separated block sizes."})
    prompts: str = field(default="eval", metadata={"help": "'eval' (held-out preset prompts) or a JSONL file."})
    domains: str = field(default="code,math,chat,news", metadata={"help": "With --prompts eval: these domains."})
    num_prompts: int = field(default=2, metadata={"help": "Prompts per domain (of the file, with a JSONL file)."})
    max_new_tokens: int = field(default=96, metadata={"help": "New tokens per prompt."})
    passes: int = field(default=2, metadata={"help": "Passes over every configuration, alternating within each."})
    reference_tau: float = field(default=1.64, metadata={"help": "τ of the drafter as it is, alone in the engine."})
    num_threads: int | None = num_threads_field()
    json: str = field(default="drafter_cost.json", metadata={"help": "Where to write the results ('' to skip)."})
    machine_note: str = field(default="", metadata={"help": "Appended to the machine in the provenance, e.g. 'idle'."})

    def __post_init__(self):
        for name, values in (("--layers", self.depths), ("--blocks", self.block_sizes)):
            if not values or min(values) < 1:
                raise ValueError(f"{name} {getattr(self, name[2:])!r}: give positive integers, e.g. 1,2,3,5.")
        if min(self.block_sizes) < 2:
            raise ValueError(f"--blocks {self.blocks!r}: a block holds the anchor and at least one draft (>= 2).")
        if self.num_prompts < 1 or self.max_new_tokens < 1 or self.passes < 1 or self.reference_tau <= 0:
            raise ValueError("--num-prompts, --max-new-tokens, --passes and --reference-tau must be positive.")
        if self.drafter == "fresh":
            raise ValueError("--drafter fresh: give 'auto' (the bundled drafter) or a drafter folder to grow.")
        check_choice("--dtype", self.dtype, DTYPES)

    @staticmethod
    def _ints(text: str) -> list[int]:
        try:
            return sorted({int(s) for s in text.split(",") if s.strip()})
        except ValueError:
            return []

    @property
    def depths(self) -> list[int]:
        return self._ints(self.layers)

    @property
    def block_sizes(self) -> list[int]:
        return self._ints(self.blocks)


def drafter_source(args: DrafterCostArgs) -> Path:
    """The folder of the drafter to grow: the bundled one for ``auto``, else ``--drafter``."""
    from adaflash_hf.drafters import bundled_drafter_path

    if args.drafter == "auto":
        path = bundled_drafter_path(args.target)
        if path is None:
            raise ValueError(f"--drafter auto: no bundled drafter for {args.target!r}; give a drafter folder.")
        return path
    if not Path(args.drafter).is_dir():
        raise ValueError(f"--drafter {args.drafter!r}: not a folder; give a drafter folder or 'auto'.")
    return Path(args.drafter)


def base_config(source: Path, depths: list[int]):
    """The drafter's config; every depth asked for must be at least its own (layers are only added)."""
    from adaflash_hf.configuration_adaflash import AdaFlashDrafterConfig

    config = AdaFlashDrafterConfig.from_pretrained(source)
    have = config.num_hidden_layers
    if min(depths) < have:
        raise ValueError(
            f"--layers {min(depths)}: the drafter already has {have} layers; give depths of {have} or more."
        )
    return config


def make_variant(source: Path, folder: Path, layers: int, block: int) -> Path:
    """Save the drafter at ``source`` grown to ``layers`` layers (identity layers), with a ``block``-position block."""
    from adaflash_hf.modeling_adaflash import AdaFlashDrafter
    from adaflash_hf.training.init import grow_drafter

    drafter = AdaFlashDrafter.from_pretrained(source)
    have = drafter.config.num_hidden_layers
    if layers > have:
        grow_drafter(drafter, layers - have)
    drafter.config.block_size = block
    drafter.save_pretrained(folder)
    return folder


def time_configs(target, drafters: dict, prompts: list, args: DrafterCostArgs, pad_token_id) -> tuple[dict, float]:
    """Per configuration: the engine's summed timings over every pass; and plain decoding's ms per token."""
    import dataclasses

    from adaflash_hf import DraftingConfig, DraftingState, FixedVerifyLength
    from adaflash_hf.profile import new_totals, timed_generate, timed_plain_generate

    # every round drafts (the engine would skip a drafter that does not pay) and verifies the whole block
    drafting = dataclasses.replace(DraftingConfig.only("drafter"), drafter_every_round=True)
    kwargs = dict(drafting=drafting, verify_policy=FixedVerifyLength())
    totals = {key: new_totals() for key in drafters}
    plain_s, plain_tokens = 0.0, 0
    for done in range(args.passes):
        for key, drafter in drafters.items():
            for ids in prompts:
                state = DraftingState()  # every prompt starts cold: the rounds depend on the drafter alone
                timed_generate(totals[key], target, drafter, ids, args.max_new_tokens, drafting_state=state, **kwargs)
        for ids in prompts:
            seconds, tokens = timed_plain_generate(target, ids, args.max_new_tokens, pad_token_id)
            plain_s, plain_tokens = plain_s + seconds, plain_tokens + tokens
        print(f"[drafter-cost] pass {done + 1}/{args.passes} done", file=sys.stderr)
    return totals, plain_s / plain_tokens * 1e3


def summarise(totals: dict, plain_ms: float, reference: tuple[int, int], starts: int, args: DrafterCostArgs) -> list:
    """Per configuration: τ, the drafter pass, the verification and the round (ms), and the τ it needs.

    Configurations with the same block and the same rounds (identity layers draft the same tokens) verify exactly
    the same tokens, so their verification is priced at its mean over them (``verify_pooled_ms``): the spread
    between them is machine noise, and the round compared (``round_pooled_ms``) differs only by the drafter pass
    and the bookkeeping around it.
    """
    rows = []
    for (layers, block), total in totals.items():
        rounds = max(1, total["rounds"])
        rows.append(
            {
                "layers": layers,
                "block_size": block,
                "rounds": total["rounds"],
                "tokens": total["tokens"],
                "tau": round(total["tokens"] / (total["rounds"] + starts), 3),  # the prefill's token counts as a round
                "propose_ms": total["draft"] / rounds * 1e3,
                "verify_ms": total["verify"] / rounds * 1e3,
                "round_ms": (total["wall"] - total["prefill"]) / rounds * 1e3,
            }
        )
    for row in rows:
        same = [
            r
            for r in rows
            if (r["block_size"], r["rounds"], r["tokens"]) == (row["block_size"], row["rounds"], row["tokens"])
        ]
        row["verify_pooled_ms"] = sum(r["verify_ms"] for r in same) / len(same)
        row["round_pooled_ms"] = row["round_ms"] - row["verify_ms"] + row["verify_pooled_ms"]
        row["round_in_plain_steps"] = row["round_pooled_ms"] / plain_ms
    base = next((r for r in rows if (r["layers"], r["block_size"]) == reference), rows[0])
    for row in rows:
        row["tau_to_match_reference"] = args.reference_tau * row["round_in_plain_steps"] / base["round_in_plain_steps"]
        row["tau_for_2x"] = 2 * row["round_in_plain_steps"]
        for key in ("propose_ms", "verify_ms", "round_ms", "verify_pooled_ms", "round_pooled_ms"):
            row[key] = round(row[key], 3)
        for key in ("round_in_plain_steps", "tau_to_match_reference", "tau_for_2x"):
            row[key] = round(row[key], 3)
    return rows


def print_table(rows: list[dict], plain_ms: float, reference_tau: float) -> None:
    print(f"plain decoding: {plain_ms:.2f} ms per token")
    header = (
        f"{'layers':>6} {'block':>5} {'τ':>5} {'draft ms':>9} {'verify ms':>9} {'pooled':>7} {'round ms':>9} "
        f"{'× plain':>7} {f'τ = {reference_tau:.2f} ×1':>10} {'τ for 2×':>8}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['layers']:>6} {r['block_size']:>5} {r['tau']:>5.2f} {r['propose_ms']:>9.2f} {r['verify_ms']:>9.2f} "
            f"{r['verify_pooled_ms']:>7.2f} {r['round_pooled_ms']:>9.2f} {r['round_in_plain_steps']:>7.2f} "
            f"{r['tau_to_match_reference']:>10.2f} {r['tau_for_2x']:>8.2f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_dataclass_arguments(parser, DrafterCostArgs)
    try:
        args = dataclass_from_args(DrafterCostArgs, parser.parse_args(argv))
        source = drafter_source(args)
        base = base_config(source, args.depths)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    import torch

    from adaflash_hf import load_target
    from adaflash_hf.cli_args import encode_prompt
    from adaflash_hf.data import benchmark_prompts
    from adaflash_hf.drafters import load_drafter
    from adaflash_hf.provenance import write_script_json

    if args.num_threads is not None:
        torch.set_num_threads(args.num_threads)
    reference = (base.num_hidden_layers, base.block_size)
    target, tokenizer = load_target(args.target, dtype=args.dtype)
    items = benchmark_prompts(args.prompts, args.domains, args.num_prompts)
    prompts = [encode_prompt(tokenizer, item["prompt"]).to(target.device) for item in items]
    workdir = Path(tempfile.mkdtemp(prefix="drafter-cost-"))
    drafters = {}
    for block in args.block_sizes:
        for layers in args.depths:
            folder = make_variant(source, workdir / f"L{layers}-B{block}", layers, block)
            drafters[(layers, block)] = load_drafter(str(folder), target, target_name=args.target, datastore=False)
    pad = tokenizer.pad_token_id
    warm = encode_prompt(tokenizer, "Hi!").to(target.device)
    with torch.inference_mode():
        time_configs(target, drafters, [warm], DrafterCostArgs(**{**vars(args), "passes": 1, "max_new_tokens": 8}), pad)
        totals, plain_ms = time_configs(target, drafters, prompts, args, pad)
    rows = summarise(totals, plain_ms, reference, len(prompts) * args.passes, args)
    print_table(rows, plain_ms, args.reference_tau)
    if args.json:
        results = {"plain_ms_per_token": round(plain_ms, 3), "reference": list(reference), "rows": rows}
        write_script_json("benchmarks/training/drafter_cost.py", argv, args, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
