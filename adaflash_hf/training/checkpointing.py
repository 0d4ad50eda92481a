"""A drafter training run's checkpoints: ``checkpoints/step_N`` written, found for resuming, and exported.

A checkpoint holds the drafter, the optimizer, the loop's state (step, elapsed time) and every RNG, so a
rerun of the same ``output_dir`` resumes where the last one stopped.
"""

from __future__ import annotations

import json
import logging
import pickle
import random
import shutil
from pathlib import Path

import torch

from ..modeling_adaflash import AdaFlashDrafter

logger = logging.getLogger(__name__)


def _steps(output_dir: Path) -> list[Path]:
    """``checkpoints/step_N`` folders under ``output_dir``, oldest first."""
    return sorted((output_dir / "checkpoints").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))


def read_checkpoint(checkpoint_dir: str | Path) -> dict:
    """The contents of ``checkpoint_dir/checkpoint.pt``; a ValueError that says so when it cannot be read."""
    path = Path(checkpoint_dir) / "checkpoint.pt"
    try:
        return torch.load(path, weights_only=False)
    except (OSError, EOFError, RuntimeError, pickle.UnpicklingError) as e:
        reason = f"training checkpoint {path} cannot be read ({e})"
        raise ValueError(f"{reason}: it is missing, truncated or corrupt") from None


def load_latest_checkpoint(output_dir: Path) -> tuple[Path, dict] | None:
    """The newest readable ``checkpoints/step_N`` under ``output_dir`` and its contents, or None before the first.

    An unreadable newer checkpoint (a disk fault, a partial copy) is skipped with a warning, so a run loses only the
    steps since the one before it; when none can be read, a ValueError says what to do rather than starting over.
    """
    errors = []
    for path in reversed(_steps(output_dir)):
        try:
            return path, read_checkpoint(path)
        except ValueError as e:
            logger.warning("%s; trying the checkpoint before it", e)
            errors.append(str(e))
    if errors:
        raise ValueError(
            f"no checkpoint under {output_dir / 'checkpoints'} can be read ({errors[0]}). Move that folder away to "
            f"start this run over, or rerun with --no-resume."
        )
    return None


def trim_metrics(metrics_path: Path, step: int) -> int:
    """Drop the records of ``metrics.jsonl`` past ``step`` (the checkpoint a run resumes from; -1 for a fresh run),
    so that the steps a resumed run repeats are logged once; returns how many were dropped."""
    if not metrics_path.exists():
        return 0
    lines = [line for line in metrics_path.read_text().splitlines() if line.strip()]
    kept = [line for line in lines if json.loads(line).get("step", 0) <= step]
    if len(kept) < len(lines):
        metrics_path.write_text("".join(line + "\n" for line in kept))
    return len(lines) - len(kept)


def save_checkpoint(output_dir: Path, drafter, optimizer, state: dict, generator: torch.Generator) -> None:
    """Write ``checkpoints/step_N`` through a temporary folder (a crash never leaves half a checkpoint); keep the
    newest two."""
    root = output_dir / "checkpoints"
    path = root / f"step_{state['step']}"
    tmp = root / f"tmp_step_{state['step']}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch.save(
        {
            "drafter": drafter.state_dict(),
            "optimizer": optimizer.state_dict(),
            "state": state,
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate(), "generator": generator.get_state()},
        },
        tmp / "checkpoint.pt",
    )
    drafter.config.save_pretrained(tmp)
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    for old in _steps(output_dir)[:-2]:
        shutil.rmtree(old)


def export_checkpoint(checkpoint_dir: str | Path, out_dir: str | Path) -> Path:
    """Write a training checkpoint (``checkpoints/step_N``) as a bf16 drafter folder loadable with from_pretrained."""
    checkpoint_dir = Path(checkpoint_dir)
    config = AdaFlashDrafter.config_class.from_pretrained(checkpoint_dir)
    drafter = AdaFlashDrafter(config)
    drafter.load_state_dict(read_checkpoint(checkpoint_dir)["drafter"])
    drafter.to(torch.bfloat16).save_pretrained(out_dir)
    return Path(out_dir)
