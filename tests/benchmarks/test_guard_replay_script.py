"""benchmarks/profile/guard_replay.py on a synthetic round log: a guard that speculates where the logged speculative
rounds beat plain steps and holds where they lose; bad inputs get one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import load_script as load_script_at

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "profile" / "guard_replay.py"


def load_script():
    return load_script_at(SCRIPT, "guard_replay_script")


def write_log(path: Path) -> None:
    def line(rows, proposed, tokens, steps, remeasuring=False, method="adaflash", pass_=0):
        return json.dumps(
            {
                "method": method,
                "concurrency": rows,
                "pass": pass_,
                "rows": rows,
                "proposed": proposed,
                "exploring": remeasuring,
                "remeasuring": remeasuring,
                "held": False,
                "tokens": tokens,
                "steps": steps,
                "seconds": 0.1 * steps,
            }
        )

    lines = []
    for _ in range(40):  # 8 rows: speculation makes 1.5 tokens a row per plain step; 16 rows: 1.0 in 1.5 steps
        lines += [
            line(8, True, 1.5, 1.0),
            line(8, False, 1.0, 1.0),
            line(16, True, 1.0, 1.5),
            line(16, False, 1.0, 1.0),
        ]
    lines += [line(8, True, 2.0, 1.2, remeasuring=True), line(16, True, 2.0, 2.5, remeasuring=True)]
    lines += [line(8, True, 0.0, 9.0, pass_="warmup"), line(8, True, 0.0, 9.0, method="other")]  # neither replayed
    path.write_text("\n".join(lines) + "\n")


def test_the_replay_speculates_where_logged_speculation_pays_and_holds_where_it_loses(tmp_path, capsys):
    log, out = tmp_path / "rounds.jsonl", tmp_path / "replay.json"
    write_log(log)
    settings = json.dumps({"default": {}, "never pays": {"margin": 0.5}})  # margin < 1 discounts speculation
    argv = ["--log", str(log), "--settings", settings, "--rounds", "400", "--seeds", "3", "--json", str(out)]
    assert load_script().main(argv) == 0
    payload = json.loads(out.read_text())
    assert set(payload["provenance"]) == {"command", "machine", "code_commit", "date"}
    eight, sixteen = payload["results"]
    assert (eight["rows"], sixteen["rows"]) == ("8-15", "16-31")
    assert eight["logged"] == {"speculative": 40, "remeasuring": 1, "plain": 40}  # no warm-up, no other method
    assert eight["speculative_rate"] == pytest.approx(1.5) and sixteen["speculative_rate"] == pytest.approx(1 / 1.5)
    assert eight["settings"]["default"]["speculative_share"] > 0.9 and eight["settings"]["default"]["rate"] > 1.4
    assert sixteen["settings"]["default"]["speculative_share"] < 0.2 and sixteen["settings"]["default"]["rate"] > 0.9
    assert eight["settings"]["never pays"]["speculative_share"] < 0.2  # the same rounds under a rule that holds
    assert "16-31" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--log", "no/such/rounds.jsonl"], "no such file"),
        (["--settings", '{"x": {"no_such_argument": 1}}'], "'x'"),
        (["--settings", "[1]"], "JSON object"),
    ],
)
def test_bad_replay_inputs_get_one_line(tmp_path, capsys, argv, message):
    log = tmp_path / "rounds.jsonl"
    write_log(log)
    argv = ["--log", str(log), *argv] if "--log" not in argv else argv
    assert load_script().main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and err.count("\n") == 0


def test_a_log_without_the_method_is_refused_in_one_line(tmp_path, capsys):
    log = tmp_path / "rounds.jsonl"
    write_log(log)
    assert load_script().main(["--log", str(log), "--method", "adaflash@4"]) == 2
    assert "no measured rounds of 'adaflash@4'" in capsys.readouterr().err
