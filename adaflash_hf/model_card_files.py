"""Model cards written to disk: a drafter or length-head folder's ``README.md``, and the bundled cards.

:func:`folder_card` reads a folder's ``config.json`` and ``training_summary.json`` (plus what sits beside them)
and renders its card with :mod:`adaflash_hf.model_card`. The bundled folders' ``README.md`` and the repository's
``model_cards/*.md`` are the same cards, rendered from :data:`BUNDLED_CARDS` by :func:`bundled_card`;
``python -m adaflash_hf.model_card_files`` rewrites them all, and ``tests/test_model_card.py`` checks that the
files are current.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import ModelCard

from .model_card import TEMPLATES, drafter_card, length_head_card


def _notes_file(name: str) -> tuple[str, ...]:
    """The Notes of a bundled card from ``model_card_templates/notes/<name>.md``: one per ``- `` bullet, continuation
    lines joined with spaces; none when the file does not exist."""
    path = TEMPLATES / "notes" / f"{name}.md"
    if not path.is_file():
        return ()
    notes: list[str] = []
    for line in path.read_text().splitlines():
        if line.startswith("- "):
            notes.append(line[2:].strip())
        elif line.strip() and notes:
            notes[-1] += " " + line.strip()
    return tuple(notes)


@dataclass(frozen=True)
class BundledCard:
    """A folder under ``adaflash_hf/bundled/`` whose ``README.md`` is also ``model_cards/<name>.md``.

    bench_json: an ``adaflash bench`` JSON under the repository root whose ``adaflash`` rows the card
    reports. The card's Notes (how the numbers were obtained) are ``model_card_templates/notes/<name>.md``.
    """

    folder: str
    name: str
    bench_json: str | None = None

    @property
    def notes(self) -> tuple[str, ...]:
        return _notes_file(self.name)


BUNDLED_CARDS = (
    BundledCard("smollm2-135m", "smollm2-135m-adaflash", "benchmarks/batch1/smollm2-135m.json"),
    BundledCard("qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-adaflash", "benchmarks/batch1/qwen2.5-coder-1.5b.json"),
    BundledCard("smollm2-135m-length-head", "smollm2-135m-length-head"),
    BundledCard("qwen2.5-coder-1.5b-length-head", "qwen2.5-coder-1.5b-length-head"),
)


def folder_card(
    folder: str | Path,
    bench: dict | None = None,
    repo_id: str | None = None,
    notes: tuple[str, ...] | list[str] = (),
    name: str | None = None,
) -> ModelCard:
    """Card of a drafter or length-head folder, from its ``config.json`` and ``training_summary.json``."""
    folder = Path(folder)
    summary_path = folder / "training_summary.json"
    if not summary_path.is_file():
        raise FileNotFoundError(f"{summary_path} is missing: model cards are rendered from the trainer's summary.")
    config = json.loads((folder / "config.json").read_text())
    summary = json.loads(summary_path.read_text())
    if config["model_type"] == "adaflash_length_head":
        return length_head_card(config, summary, name=name)
    draft_vocab = folder / "draft_vocab.json"
    draft_data = json.loads(draft_vocab.read_text()) if draft_vocab.is_file() else None
    prior_file = folder / "acceptance_prior.json"
    prior = json.loads(prior_file.read_text()) if prior_file.is_file() else None
    return drafter_card(config, summary, bench, repo_id, notes, draft_data, name=name, prior=prior)


def write_model_card(
    folder: str | Path,
    bench_json: str | Path | None = None,
    repo_id: str | None = None,
    notes: tuple[str, ...] | list[str] = (),
) -> Path:
    """Write ``README.md`` into a drafter or length-head folder (see :func:`folder_card`); returns its path."""
    bench = json.loads(Path(bench_json).read_text()) if bench_json else None
    path = Path(folder) / "README.md"
    folder_card(folder, bench, repo_id, notes).save(path)
    return path


def bundled_card(entry: BundledCard, repo_root: str | Path) -> ModelCard:
    """The card of a bundled folder; ``repo_root`` holds the ``benchmarks/`` folder its bench JSON lives in."""
    from .drafters import BUNDLED_DIR

    bench = json.loads((Path(repo_root) / entry.bench_json).read_text()) if entry.bench_json else None
    return folder_card(BUNDLED_DIR / entry.folder, bench, notes=entry.notes, name=entry.name)


def write_bundled_cards(repo_root: str | Path) -> list[Path]:
    """Write every bundled folder's ``README.md`` and ``model_cards/<name>.md`` (the same text); returns the paths."""
    from .drafters import BUNDLED_DIR

    written = []
    for entry in BUNDLED_CARDS:
        card = bundled_card(entry, repo_root)
        for path in (BUNDLED_DIR / entry.folder / "README.md", Path(repo_root) / "model_cards" / f"{entry.name}.md"):
            card.save(path)
            written.append(path)
    return written


if __name__ == "__main__":  # python -m adaflash_hf.model_card_files: regenerate the bundled cards of this checkout
    for written_path in write_bundled_cards(Path(__file__).resolve().parents[1]):
        print(written_path)
