"""benchmarks/profile/held_round.py on tiny local folders: a table, and JSON with provenance, at every batch size."""

from __future__ import annotations

import json
from pathlib import Path

from test_integration import word_tokenizer

from adaflash_hf import AdaFlashDrafter

from conftest import load_script as load_script_at
from conftest import tiny_target

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "profile" / "held_round.py"


def load_script():
    return load_script_at(SCRIPT, "held_round_script")


def test_held_round_profile_times_both_engines_at_every_batch_size(tmp_path, capsys):
    target = tiny_target("qwen3")
    target.save_pretrained(tmp_path / "target")
    word_tokenizer().save_pretrained(tmp_path / "target")
    AdaFlashDrafter.from_target(target, num_layers=1, block_size=4).save_pretrained(tmp_path / "drafter")
    out = tmp_path / "held.json"
    argv = ["--target", str(tmp_path / "target"), "--drafter", str(tmp_path / "drafter"), "--batch-sizes", "1,3"]
    argv += ["--rounds", "3", "--warmup", "1", "--prompt-tokens", "6", "--dtype", "fp32", "--json", str(out)]
    assert load_script().main(argv) == 0
    payload = json.loads(out.read_text())
    assert set(payload["provenance"]) == {"command", "machine", "code_commit", "date"}
    assert [r["batch_size"] for r in payload["results"]] == [1, 3]
    assert all(r["plain_ms"] > 0 and r["held_ms"] > 0 and r["held_vs_plain"] > 0 for r in payload["results"])
    assert "held/plain" in capsys.readouterr().out


def test_held_round_profile_rejects_bad_batch_sizes_in_one_line(capsys):
    assert load_script().main(["--batch-sizes", "4,x"]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0
