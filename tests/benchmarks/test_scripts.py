"""Smoke test of every Python script under benchmarks/: each imports without running anything."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import load_script

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = sorted(BENCHMARKS.rglob("*.py"))


def test_there_are_scripts_to_check():
    assert any(p.name == "make_tables.py" for p in SCRIPTS)


@pytest.mark.parametrize("path", SCRIPTS, ids=[str(p.relative_to(BENCHMARKS)) for p in SCRIPTS])
def test_the_script_imports_without_side_effects(path: Path):
    """Imported under a name other than __main__, so a script's work stays behind its main guard."""
    module = load_script(path, f"benchmark_script_{path.stem}")
    assert module.__doc__, f"{path} opens with no docstring saying what it owns"


@pytest.mark.parametrize(
    "path",
    [p for p in SCRIPTS if p.name != "__init__.py"],
    ids=[str(p.relative_to(BENCHMARKS)) for p in SCRIPTS if p.name != "__init__.py"],
)
def test_the_script_runs_only_under_a_main_guard(path: Path):
    tree = ast.parse(path.read_text())
    guards = [node for node in tree.body if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)]
    assert guards, f'{path} has no `if __name__ == "__main__":` guard'
