"""The docs' table regions: every published table sits between a well-formed pair of markers, where the
table generator (benchmarks/make_tables.py) expects it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"<!-- (?:table: ([a-z0-9_]+)|(/table)) -->")
RESULTS_TABLES = {
    "batch1_smollm2",
    "batch1_qwen",
    "serving_smollm2",
    "serving_smollm2_no_bf16",
    "serving_deployment",
    "opd_smollm2",
    "soak_opd",
    "quality",
    "training_scaling",
    "drafter_replay",
    "drafter_replay_qwen",
    "profile_smollm2",
    "held_round",
    "verify_cost",
}


def regions(path: Path) -> list[str]:
    """The names of ``path``'s table regions in order; fails on an unclosed, nested or stray marker."""
    names, open_name = [], None
    for match in MARKER.finditer(path.read_text()):
        name, close = match.groups()
        if name:
            assert open_name is None, f"{path}: region {name!r} opens inside {open_name!r}"
            open_name = name
        else:
            assert open_name is not None, f"{path}: a closing marker without an opening one"
            names.append(open_name)
            open_name = None
    assert open_name is None, f"{path}: region {open_name!r} is never closed"
    return names


@pytest.mark.parametrize(
    "page", ["README.md", *(str(p.relative_to(ROOT)) for p in sorted((ROOT / "docs").rglob("*.md")))]
)
def test_table_markers_are_well_formed_and_unique_per_page(page):
    names = regions(ROOT / page)
    assert len(names) == len(set(names)), f"{page}: a table region appears twice: {names}"


def test_the_front_page_and_the_results_page_hold_their_tables():
    assert set(regions(ROOT / "README.md")) == {"batch1_smollm2", "batch1_qwen"}
    assert set(regions(ROOT / "docs" / "results.md")) == RESULTS_TABLES
