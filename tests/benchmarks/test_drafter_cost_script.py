"""benchmarks/training/drafter_cost.py on tiny local folders: every depth and block timed, identity growth checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_integration import word_tokenizer

from adaflash_hf import AdaFlashDrafter

from conftest import load_script as load_script_at
from conftest import tiny_target

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "training" / "drafter_cost.py"


def load_script():
    return load_script_at(SCRIPT, "drafter_cost_script")


@pytest.fixture
def folders(tmp_path):
    target = tiny_target("qwen3")
    target.save_pretrained(tmp_path / "target")
    word_tokenizer().save_pretrained(tmp_path / "target")
    AdaFlashDrafter.from_target(target, num_layers=1, block_size=4).save_pretrained(tmp_path / "drafter")
    prompts = tmp_path / "prompts.jsonl"
    lines = [{"prompt": " ".join(f"w{(7 * i + j) % 40 + 4}" for j in range(9)), "domain": "x"} for i in range(2)]
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return tmp_path


def test_every_depth_and_block_is_timed_and_grown_layers_keep_the_rounds(folders, capsys):
    out = folders / "cost.json"
    argv = ["--target", str(folders / "target"), "--drafter", str(folders / "drafter"), "--layers", "1,3"]
    argv += ["--blocks", "4,6", "--prompts", str(folders / "prompts.jsonl"), "--max-new-tokens", "12"]
    argv += ["--passes", "1", "--dtype", "fp32", "--reference-tau", "1.5", "--json", str(out)]
    assert load_script().main(argv) == 0
    payload = json.loads(out.read_text())
    assert set(payload["provenance"]) == {"command", "machine", "code_commit", "date"}
    rows = {(r["layers"], r["block_size"]): r for r in payload["results"]["rows"]}
    assert set(rows) == {(1, 4), (3, 4), (1, 6), (3, 6)}
    assert payload["results"]["reference"] == [1, 4]
    # identity layers: at the drafter's own block every depth drafts the same tokens, so the rounds are the same
    assert rows[(3, 4)]["rounds"] == rows[(1, 4)]["rounds"] and rows[(3, 4)]["tau"] == rows[(1, 4)]["tau"]
    assert rows[(1, 4)]["tau_to_match_reference"] == 1.5
    # the same tokens verified at every depth of a block: priced once, at their mean
    for block in (4, 6):
        same = [r for r in rows.values() if r["block_size"] == block]
        assert same[0]["verify_pooled_ms"] == same[1]["verify_pooled_ms"]
        assert same[0]["verify_pooled_ms"] == pytest.approx(sum(r["verify_ms"] for r in same) / 2, abs=2e-3)
    for row in rows.values():
        assert row["round_pooled_ms"] == pytest.approx(
            row["round_ms"] - row["verify_ms"] + row["verify_pooled_ms"], abs=3e-3
        )
        assert row["round_ms"] > 0 and row["propose_ms"] > 0 and row["verify_ms"] > 0
        assert row["tau_for_2x"] == pytest.approx(2 * row["round_in_plain_steps"], abs=3e-3)  # both rounded to 3 places
    assert "τ for 2×" in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--layers", "2,x"], "--layers"),
        (["--blocks", "1"], "at least one draft"),
        (["--drafter", "fresh"], "--drafter fresh"),
        (["--drafter", "/no/such/folder"], "not a folder"),
    ],
)
def test_bad_arguments_get_one_line(extra, message, capsys):
    assert load_script().main(extra) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err


def test_depths_below_the_drafters_own_are_refused_in_one_line(folders, capsys):
    target = AdaFlashDrafter.from_pretrained(folders / "drafter")
    AdaFlashDrafter(target.config.__class__(**{**target.config.to_dict(), "num_hidden_layers": 2})).save_pretrained(
        folders / "deep"
    )
    argv = ["--target", str(folders / "target"), "--drafter", str(folders / "deep"), "--layers", "1,2"]
    argv += ["--prompts", str(folders / "prompts.jsonl"), "--dtype", "fp32", "--json", ""]
    capsys.readouterr()
    assert load_script().main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "already has 2 layers" in err
