"""Packaging: one source for the version, the license users expect, and package data that ships."""

from __future__ import annotations

from pathlib import Path

import pytest

import adaflash_hf

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_version_is_read_from_the_package(pyproject):
    assert "version" not in pyproject["project"] and "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "adaflash_hf.__version__"}
    assert adaflash_hf.__version__.count(".") == 2


def test_the_license_is_the_apache_2_text(pyproject):
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
    assert "Copyright 2026 The adaflash-hf authors" in text
    assert pyproject["project"]["license"] == {"text": "Apache-2.0"}


def test_package_data_covers_the_shipped_prompts(pyproject):
    patterns = pyproject["tool"]["setuptools"]["package-data"]["adaflash_hf"]
    package = Path(adaflash_hf.__file__).parent
    shipped = {p for pattern in patterns for p in package.glob(pattern)}
    assert package / "data" / "instruct_prompts.jsonl" in shipped


MAX_MODULE_LINES = 450


def test_no_module_is_longer_than_a_reader_can_hold():
    """Each module owns one concept; past this many lines it is split by concept. The bundled Hub copies of the
    drafter and length-head files are exempt: they must stay byte-identical to the published folders."""
    package = ROOT / "adaflash_hf"
    too_long = {
        str(path.relative_to(ROOT)): lines
        for path in sorted(package.rglob("*.py"))
        if "bundled" not in path.relative_to(package).parts
        and (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert too_long == {}, f"modules over {MAX_MODULE_LINES} lines: split them by concept"
