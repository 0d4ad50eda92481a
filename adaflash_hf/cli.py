"""The ``adaflash`` command line: one registry of commands, each a config dataclass plus a run function.

A command's options come from its config dataclass (field help text included), so the CLI and the
Python API share one set of defaults and one validation. ``COMMANDS`` names where each dataclass and
run function live; only the command being run is imported, so ``adaflash --help`` imports neither
torch nor transformers. A command whose module is not there is left out of the list.

A user error (a bad value, a missing file) prints one ``error:`` line and exits with status 2;
anything else prints a one-line summary and exits with 1. ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.machinery
import importlib.util
import logging
import sys
import time
from dataclasses import dataclass, field

from .cli_args import (
    DTYPES,
    add_dataclass_arguments,
    check_choice,
    dataclass_from_args,
    drafter_field,
    dtype_field,
    encode_prompt,
    seed_field,
    target_field,
)
from .targets import DEFAULT_TARGET

logger = logging.getLogger(__name__)

USER_ERRORS = (ValueError, OSError, ImportError)  # bad values, missing files or models, missing extras


@dataclass(frozen=True)
class Command:
    """Where a command's config dataclass and run function live (``"module:name"``), and its help line.

    The run function takes the config and returns the exit status; any other return value (such as
    the folder a training run wrote) is printed and the status is 0.
    """

    config: str
    run: str
    help: str

    @property
    def module(self) -> str:
        return self.config.partition(":")[0]

    def load(self, which: str):
        module, _, name = getattr(self, which).partition(":")
        return getattr(importlib.import_module(module), name)


COMMANDS: dict[str, Command] = {
    "generate": Command(
        "adaflash_hf.cli:GenerateArgs",
        "adaflash_hf.cli:run_generate",
        "Generate from a prompt with speculative decoding, streaming text.",
    ),
    "bench": Command(
        "adaflash_hf.bench:BenchArgs",
        "adaflash_hf.bench:run_bench",
        "Benchmark decoding methods side by side; prints a table, writes JSON.",
    ),
    "profile": Command(
        "adaflash_hf.profile:ProfileArgs",
        "adaflash_hf.profile:run_profile",
        "Where the time of one speculative round goes, against one plain decode step.",
    ),
    "serve": Command(
        "adaflash_hf.serve:ServeArgs",
        "adaflash_hf.serve:run_serve",
        "Serve the target over an OpenAI-compatible HTTP API (localhost by default), with continuous batching.",
    ),
    "export": Command(
        "adaflash_hf.export:ExportArgs",
        "adaflash_hf.export:run_export",
        "Write a drafter in the DFlash layout for vLLM and SGLang; prints the lines that serve it with its target.",
    ),
    "cache-features": Command(
        "adaflash_hf.training.data_configs:CacheFeaturesConfig",
        "adaflash_hf.training.features:cache_features",
        "Run the target once over the cached responses and keep the drafter's context on disk (resumable).",
    ),
    "generate-data": Command(
        "adaflash_hf.training.data_configs:GenerateDataConfig",
        "adaflash_hf.training.data:generate_data",
        "Cache the target's own greedy responses to training prompts (resumable), for train-drafter.",
    ),
    "prepare-drafter": Command(
        "adaflash_hf.training.data_configs:PrepareDrafterConfig",
        "adaflash_hf.training.vocab:run_prepare_drafter",
        "Attach a reduced draft vocabulary (coverage table) and a datastore of the target's own outputs to a drafter.",
    ),
    "replay-drafter": Command(
        "adaflash_hf.training.replay:ReplayDrafterArgs",
        "adaflash_hf.training.replay:run_replay_drafter",
        "Drafter-alone tau on held-out prompts, replayed on the target's cached answers (no decoding, no timing).",
    ),
    "train-drafter": Command(
        "adaflash_hf.training.configs:TrainDrafterConfig",
        "adaflash_hf.training.trainer:train_drafter",
        "Train a drafter for a target (DFlash recipe), with checkpoints and resume.",
    ),
    "bench-opd": Command(
        "adaflash_hf.online.bench_opd:BenchOPDArgs",
        "adaflash_hf.online.bench_opd:run_bench_opd",
        "On-line distillation under domain shift: τ over live requests, tokens/s with OPD on and off.",
    ),
    "soak-opd": Command(
        "adaflash_hf.online.soak:SoakArgs",
        "adaflash_hf.online.soak:run_soak",
        "Reliability soak: serving with OPD, adapter swaps and injected faults; checks every request.",
    ),
    "train-length-head": Command(
        "adaflash_hf.training.configs:TrainLengthHeadConfig",
        "adaflash_hf.training.length_head:train_length_head",
        "Train the adaptive verify-length head from the engine's acceptance records.",
    ),
    "setup-vllm": Command(
        "adaflash_hf.vllm_env:SetupVllmArgs",
        "adaflash_hf.vllm_env:setup_vllm",
        "Make (or check) a separate venv with vLLM, CPU or CUDA build, for the vLLM benchmark and tests.",
    ),
    "demo": Command(
        "adaflash_hf.demo:DemoArgs",
        "adaflash_hf.demo:run_demo",
        "Start the Gradio demo (plain vs AdaFlash side by side), bound to localhost.",
    ),
}


def _module_exists(module: str) -> bool:
    """Whether ``module`` can be found, without importing it or its packages (their imports may be heavy)."""
    parts = module.split(".")
    spec = importlib.util.find_spec(parts[0])  # adaflash_hf: already imported, so this imports nothing
    for i in range(1, len(parts)):
        if spec is None or spec.submodule_search_locations is None:
            return False
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: i + 1]), spec.submodule_search_locations)
    return spec is not None


def available_commands() -> dict[str, Command]:
    """The commands whose modules exist (commands still being written are left out)."""
    found = {}
    for name, command in COMMANDS.items():
        if _module_exists(command.module):
            found[name] = command
        else:
            logger.debug("command %s hidden: module %s not found", name, command.module)
    return found


@dataclass
class GenerateArgs:
    prompt: str = field(
        default="Write a Python function that checks whether a number is prime.",
        metadata={"help": "User message (the chat template is applied when the tokenizer has one)."},
    )
    target: str = target_field(DEFAULT_TARGET)
    drafter: str = drafter_field()
    max_new_tokens: int = field(default=128, metadata={"help": "Tokens to generate."})
    dtype: str = dtype_field()
    verify_len: int | None = field(
        default=None,
        metadata={
            "help": (
                "Tokens the target verifies per round (anchor + drafts), at most the longest proposal; default: "
                "chosen per round for the most expected tokens per second."
            )
        },
    )
    sources: str = field(
        default="drafter,suffix,global,datastore",
        metadata={
            "help": (
                "Draft sources the engine may choose from each round (comma-separated subset of drafter, suffix, "
                "global, datastore)."
            )
        },
    )
    tree_nodes: int | None = field(
        default=None,
        metadata={
            "help": (
                "Most draft tokens a row verifies per round as a draft tree of its candidates; 0 verifies the "
                "single best candidate; default: the library's (DraftingConfig.tree_nodes)."
            )
        },
    )
    temperature: float = field(default=0.0, metadata={"help": "0 for greedy; > 0 samples (still lossless)."})
    seed: int = seed_field("sampling")
    compare_plain: bool = field(default=False, metadata={"help": "Also run the target alone and report the speed-up."})
    raw: bool = field(default=False, metadata={"help": "Use the prompt as raw text, without the chat template."})

    def __post_init__(self):
        if not self.prompt.strip():
            raise ValueError("--prompt is empty: give the text to continue or answer.")
        if self.max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens {self.max_new_tokens}: ask for at least 1 new token.")
        if not self.temperature >= 0:  # also catches nan
            raise ValueError(f"--temperature {self.temperature}: must be >= 0 (0 is greedy, > 0 samples).")
        if self.verify_len is not None and self.verify_len < 1:
            raise ValueError(f"--verify-len {self.verify_len}: must be >= 1 (the anchor plus any drafts), or unset.")
        check_choice("--dtype", self.dtype, DTYPES)
        self.drafting()  # validate --sources

    def drafting(self):
        from .decoding.config import DraftingConfig

        return DraftingConfig.from_sources(self.sources, self.tree_nodes)


def run_generate(args: GenerateArgs) -> int:
    import torch
    from transformers import TextStreamer

    from . import FixedVerifyLength, generate, load_target
    from .checks import check_verify_len
    from .drafters import load_drafter

    torch.manual_seed(args.seed)
    start = time.perf_counter()
    target, tokenizer = load_target(args.target, dtype=args.dtype)
    drafter = load_drafter(args.drafter, target, target_name=args.target)
    drafting = args.drafting()
    if args.verify_len is not None:
        check_verify_len(args.verify_len, drafter, drafting)
    layers = drafter.config.num_hidden_layers
    print(
        f"[adaflash] target {args.target} ({target.dtype}), drafter {args.drafter} (block {drafter.config.block_size}, "
        f"{layers} layer{'s' if layers != 1 else ''}); loaded in {time.perf_counter() - start:.1f}s",
        file=sys.stderr,
    )
    input_ids = encode_prompt(tokenizer, args.prompt, args.raw).to(target.device)
    sampling = dict(do_sample=args.temperature > 0, temperature=args.temperature or 1.0, top_k=None, top_p=None)
    streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    if args.compare_plain:  # warm both paths up on another prompt: first calls pay one-off costs
        warm = encode_prompt(tokenizer, "Hi!").to(target.device)
        generate(target, drafter, warm, max_new_tokens=8, **sampling)
        target.generate(
            warm,
            attention_mask=torch.ones_like(warm),
            max_new_tokens=8,
            pad_token_id=tokenizer.pad_token_id,
            **sampling,
        )
    start = time.perf_counter()
    out = generate(
        target,
        drafter,
        input_ids,
        max_new_tokens=args.max_new_tokens,
        streamer=streamer,
        verify_policy=FixedVerifyLength(args.verify_len) if args.verify_len else None,
        drafting=drafting,
        tokenizer=tokenizer,
        generator=torch.Generator().manual_seed(args.seed),
        **sampling,
    )
    seconds = time.perf_counter() - start
    n = out.num_new_tokens[0]
    sources = ", ".join(f"{s} {r}" for s, (r, _) in sorted(out.stats.source_counts().items()))
    print(
        f"\n[adaflash] {n} tokens in {seconds:.2f}s = {n / seconds:.1f} tok/s | tau {out.mean_accepted_length:.2f} | "
        f"accept rate {out.accept_rate:.2f} | {out.stats.num_rounds} rounds ({sources})",
        file=sys.stderr,
    )
    if args.compare_plain:
        start = time.perf_counter()
        plain = target.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=args.max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            **sampling,
        )
        plain_seconds = time.perf_counter() - start
        m = plain.shape[1] - input_ids.shape[1]
        ours = out.sequences[0, : input_ids.shape[1] + n].tolist()
        same = plain[0].tolist() == ours
        print(
            f"[plain]    {m} tokens in {plain_seconds:.2f}s = {m / plain_seconds:.1f} tok/s | "
            f"speed-up {(n / seconds) / (m / plain_seconds):.2f}x | identical output: {same}",
            file=sys.stderr,
        )
        if not same and not sampling["do_sample"]:
            explain_difference(target, plain[0].tolist(), ours, input_ids.shape[1])
    return 0


def explain_difference(target, plain: list[int], ours: list[int], prompt_len: int) -> None:
    """Show how close the target's top two logits are where greedy outputs first differ."""
    import torch

    first = next((i for i, (a, b) in enumerate(zip(plain, ours)) if a != b), min(len(plain), len(ours)))
    with torch.inference_mode():
        logits = target(torch.tensor([plain[:first]], device=target.device)).logits[0, -1].float()
    top = logits.topk(2).values
    print(
        f"[plain]    outputs first differ at new token {first - prompt_len}, where the target's two best logits are "
        f"{top[0]:.3f} and {top[1]:.3f} (gap {top[0] - top[1]:.3f}): a near-tie that {target.dtype} rounds differently "
        "in a multi-token verification pass than in one-token decoding. Use --dtype fp32 for a bit-exact comparison.",
        file=sys.stderr,
    )


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``adaflash`` parser; only ``command``'s options are added, so only its module is imported."""
    parser = argparse.ArgumentParser(prog="adaflash", description="Lossless speculative decoding for transformers.")
    parser.add_argument("--debug", action="store_true", help="Show tracebacks and debug logs.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, entry in available_commands().items():
        command_parser = sub.add_parser(name, help=entry.help, description=entry.help)
        if name == command:
            command_parser.add_argument(
                "--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS
            )
            try:
                config_class = entry.load("config")
            except ImportError as error:
                raise ImportError(f"adaflash {name} is unavailable: {error}") from error
            add_dataclass_arguments(command_parser, config_class)
    return parser


def run_command(argv: list[str]) -> int:
    """Parse ``argv``, build the command's config (validating it) and run it."""
    command = next((a for a in argv if not a.startswith("-")), None)  # the only global options are flags
    args = build_parser(command).parse_args(argv)
    entry = COMMANDS[args.command]
    config = dataclass_from_args(entry.load("config"), args)
    result = entry.load("run")(config)
    if isinstance(result, int):
        return result
    if result is not None:
        print(result)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv
    logging.basicConfig(level=logging.DEBUG if debug else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for noisy in ("transformers", "httpx", "huggingface_hub", "filelock", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.INFO if debug else logging.ERROR)
    try:
        return run_command(argv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except USER_ERRORS as error:
        if debug:
            raise
        print(f"error: {error}", file=sys.stderr)
        return 2
    except Exception as error:
        if debug:
            raise
        summary = str(error).strip().splitlines()[0] if str(error).strip() else ""
        print(
            f"error: unexpected {type(error).__name__}: {summary} (run with --debug for the traceback)", file=sys.stderr
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
