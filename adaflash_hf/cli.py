"""The ``adaflash`` command line: generate, bench, train-drafter.

Every subcommand's options come from a dataclass (field help text included), so the CLI and the
Python API share one set of defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import shlex
import sys
import time
import types
import typing
from dataclasses import dataclass, field

import torch

from .targets import DEFAULT_TARGET, PRESETS


@dataclass
class GenerateArgs:
    prompt: str = field(default="Write a Python function that checks whether a number is prime.",
                        metadata={"help": "User message (the chat template is applied when the tokenizer has one)."})
    target: str = field(default=DEFAULT_TARGET, metadata={"help": f"Preset ({', '.join(PRESETS)}), local folder, .gguf file or Hub id."})
    drafter: str = field(default="auto", metadata={"help": "'auto' (bundled drafter for the preset), 'fresh' (untrained), a folder or a Hub id."})
    max_new_tokens: int = field(default=128, metadata={"help": "Tokens to generate."})
    dtype: str = field(default="auto", metadata={"help": "auto (bf16 on CUDA or where this CPU's bf16 matmuls measure faster than fp32, else fp32), bf16 or fp32."})
    verify_len: int | None = field(default=None, metadata={"help": "Tokens the target verifies per round (anchor + drafts); default: chosen per round for the most expected tokens per second."})
    sources: str = field(default="drafter,suffix,global,datastore", metadata={"help": "Draft sources the engine may choose from each round (comma-separated subset of drafter, suffix, global, datastore)."})
    temperature: float = field(default=0.0, metadata={"help": "0 for greedy; > 0 samples (still lossless)."})
    seed: int = field(default=0, metadata={"help": "Seed for sampling."})
    compare_plain: bool = field(default=False, metadata={"help": "Also run the target alone and report the speed-up."})
    raw: bool = field(default=False, metadata={"help": "Use the prompt as raw text, without the chat template."})

    def __post_init__(self):
        self.drafting()  # validate --sources early

    def drafting(self):
        from .decoding.proposers import SOURCES, DraftingConfig

        chosen = {s.strip() for s in self.sources.split(",") if s.strip()}
        if not chosen or chosen - set(SOURCES):
            raise ValueError(f"--sources {self.sources!r}: choose one or more of {', '.join(SOURCES)}.")
        return DraftingConfig(drafter="drafter" in chosen, suffix="suffix" in chosen, global_index="global" in chosen,
                              datastore="datastore" in chosen)


def add_dataclass_arguments(parser: argparse.ArgumentParser, cls) -> None:
    """One ``--flag`` per dataclass field, typed from its annotation, with the field's help text."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        kind = hints[f.name]
        if typing.get_origin(kind) in (typing.Union, types.UnionType):  # Optional[X] -> X
            kind = next(a for a in typing.get_args(kind) if a is not type(None))
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        default = None if required else (f.default if f.default is not dataclasses.MISSING else f.default_factory())
        help_text = (f.metadata.get("help", "") + ("" if required else f" (default: {default})")).replace("%", "%%")
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=help_text)
        elif typing.get_origin(kind) in (list, tuple):
            parser.add_argument(flag, nargs="+", type=typing.get_args(kind)[0], default=default, help=help_text)
        else:
            parser.add_argument(flag, type=kind, default=default, required=required, help=help_text)


def command_line(command: str, config) -> str:
    """The ``adaflash <command>`` line that rebuilds dataclass ``config`` (non-default fields only)."""
    parts = [f"adaflash {command}"]
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
        if value == default:
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            parts.append(flag if value else "--no-" + f.name.replace("_", "-"))
        elif isinstance(value, list | tuple):
            parts.append(f"{flag} " + " ".join(map(str, value)))
        elif value is not None:
            parts.append(f"{flag} {shlex.quote(str(value))}")
    return " ".join(parts)


def dataclass_from_args(cls, args: argparse.Namespace):
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})


def encode_prompt(tokenizer, prompt: str, raw: bool) -> torch.Tensor:
    if not prompt.strip():
        raise SystemExit("error: --prompt is empty; give the text to continue or answer.")
    if raw or not tokenizer.chat_template:
        return tokenizer(prompt, return_tensors="pt").input_ids
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                         return_tensors="pt", return_dict=True)["input_ids"]


def run_generate(args: GenerateArgs) -> int:
    from transformers import TextStreamer

    from . import FixedVerifyLength, generate, load_target
    from .drafters import load_drafter

    torch.manual_seed(args.seed)
    start = time.perf_counter()
    target, tokenizer = load_target(args.target, dtype=None if args.dtype == "auto" else args.dtype)
    drafter = load_drafter(args.drafter, target, target_name=args.target)
    print(f"[adaflash] target {args.target} ({target.dtype}), drafter {args.drafter} "
          f"(block {drafter.config.block_size}, {drafter.config.num_hidden_layers} layers); loaded in {time.perf_counter() - start:.1f}s",
          file=sys.stderr)
    input_ids = encode_prompt(tokenizer, args.prompt, args.raw).to(target.device)
    sampling = dict(do_sample=args.temperature > 0, temperature=args.temperature or 1.0, top_k=None, top_p=None)
    streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    if args.compare_plain:  # warm both paths up on another prompt: first calls pay one-off costs
        warm = encode_prompt(tokenizer, "Hi!", raw=False).to(target.device)
        generate(target, drafter, warm, max_new_tokens=8, **sampling)
        target.generate(warm, attention_mask=torch.ones_like(warm), max_new_tokens=8, pad_token_id=tokenizer.pad_token_id, **sampling)
    start = time.perf_counter()
    out = generate(target, drafter, input_ids, max_new_tokens=args.max_new_tokens, streamer=streamer,
                   verify_policy=FixedVerifyLength(args.verify_len) if args.verify_len else None, drafting=args.drafting(),
                   tokenizer=tokenizer, generator=torch.Generator().manual_seed(args.seed), **sampling)
    seconds = time.perf_counter() - start
    n = out.num_new_tokens[0]
    sources = ", ".join(f"{s} {r}" for s, (r, _) in sorted(out.stats.source_counts().items()))
    print(f"\n[adaflash] {n} tokens in {seconds:.2f}s = {n / seconds:.1f} tok/s | tau {out.mean_accepted_length:.2f} | "
          f"accept rate {out.accept_rate:.2f} | {out.stats.num_rounds} rounds ({sources})", file=sys.stderr)
    if args.compare_plain:
        start = time.perf_counter()
        plain = target.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=args.max_new_tokens,
                                pad_token_id=tokenizer.pad_token_id, **sampling)
        plain_seconds = time.perf_counter() - start
        m = plain.shape[1] - input_ids.shape[1]
        ours = out.sequences[0, : input_ids.shape[1] + n].tolist()
        same = plain[0].tolist() == ours
        print(f"[plain]    {m} tokens in {plain_seconds:.2f}s = {m / plain_seconds:.1f} tok/s | "
              f"speed-up {(n / seconds) / (m / plain_seconds):.2f}x | identical output: {same}", file=sys.stderr)
        if not same and not sampling["do_sample"]:
            explain_difference(target, plain[0].tolist(), ours, input_ids.shape[1])
    return 0


def explain_difference(target, plain: list[int], ours: list[int], prompt_len: int) -> None:
    """Show how close the target's top two logits are where greedy outputs first differ."""
    first = next((i for i, (a, b) in enumerate(zip(plain, ours)) if a != b), min(len(plain), len(ours)))
    with torch.inference_mode():
        logits = target(torch.tensor([plain[:first]], device=target.device)).logits[0, -1].float()
    top = logits.topk(2).values
    print(f"[plain]    outputs first differ at new token {first - prompt_len}, where the target's two best logits are "
          f"{top[0]:.3f} and {top[1]:.3f} (gap {top[0] - top[1]:.3f}): a near-tie that {target.dtype} rounds differently "
          "in a multi-token verification pass than in one-token decoding. Use --dtype fp32 for a bit-exact comparison.",
          file=sys.stderr)


COMMANDS: dict[str, tuple[type, typing.Callable, str]] = {
    "generate": (GenerateArgs, run_generate, "Generate from a prompt with speculative decoding, streaming text."),
}


def _register_optional_commands() -> None:
    """Commands whose modules need optional extras register only when those import."""
    try:
        from .bench import BenchArgs, run_bench
        COMMANDS["bench"] = (BenchArgs, run_bench, "Benchmark decoding methods side by side; prints a table, writes JSON.")
    except ImportError as error:  # pragma: no cover
        logging.getLogger(__name__).debug("bench unavailable: %s", error)
    try:
        from .training.trainer import TrainDrafterConfig, train_drafter
        COMMANDS["train-drafter"] = (TrainDrafterConfig, lambda cfg: (print(train_drafter(cfg)), 0)[1],
                                     "Train a drafter for a target (DFlash recipe), with checkpoints and resume.")
    except ImportError as error:  # pragma: no cover
        logging.getLogger(__name__).debug("train-drafter unavailable: %s", error)
    try:
        from .training.data import GenerateDataConfig, generate_data
        COMMANDS["generate-data"] = (GenerateDataConfig, generate_data,
                                     "Cache the target's own greedy responses to training prompts (resumable), for train-drafter.")
    except ImportError as error:  # pragma: no cover
        logging.getLogger(__name__).debug("generate-data unavailable: %s", error)
    from .profile import ProfileArgs, run_profile
    COMMANDS["profile"] = (ProfileArgs, run_profile, "Where the time of one speculative round goes, against one plain decode step.")
    from .training.vocab import PrepareDrafterConfig, run_prepare_drafter
    COMMANDS["prepare-drafter"] = (PrepareDrafterConfig, run_prepare_drafter,
                                   "Attach a reduced draft vocabulary (coverage table) and a datastore of the target's own outputs to a drafter.")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("transformers", "httpx", "huggingface_hub"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    _register_optional_commands()
    parser = argparse.ArgumentParser(prog="adaflash", description="Lossless speculative decoding for transformers.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (cls, _, help_text) in COMMANDS.items():
        add_dataclass_arguments(sub.add_parser(name, help=help_text, description=help_text), cls)
    args = parser.parse_args(argv)
    cls, run, _ = COMMANDS[args.command]
    try:
        config = dataclass_from_args(cls, args)
    except ValueError as error:
        parser.error(str(error))
    return run(config)


if __name__ == "__main__":
    sys.exit(main())
