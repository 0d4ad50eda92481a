"""The command line, end to end on a tiny local model folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_integration import word_tokenizer

from adaflash_hf import AdaFlashDrafter
from adaflash_hf.bench import BenchArgs
from adaflash_hf.cli import available_commands, main

from conftest import tiny_target


@pytest.fixture
def model_dirs(tmp_path):
    target = tiny_target("qwen3")
    target.save_pretrained(tmp_path / "target")
    word_tokenizer().save_pretrained(tmp_path / "target")
    AdaFlashDrafter.from_target(target, num_layers=1, block_size=4).save_pretrained(tmp_path / "drafter")
    return tmp_path / "target", tmp_path / "drafter"


def test_generate_command_streams_and_compares(model_dirs, capsys):
    target, drafter = model_dirs
    code = main(
        [
            "generate",
            "--target",
            str(target),
            "--drafter",
            str(drafter),
            "--raw",
            "--prompt",
            "w5 w6 w7",
            "--max-new-tokens",
            "6",
            "--dtype",
            "fp32",
            "--compare-plain",
        ]
    )
    err = capsys.readouterr().err
    assert code == 0
    assert "tau" in err and "identical output: True" in err
    assert "(block 4, 1 layer)" in err  # not "1 layers"
    code = main(
        [
            "generate",
            "--target",
            str(target),
            "--drafter",
            str(drafter),
            "--raw",
            "--prompt",
            "w5 w6 w5 w6 w5",
            "--max-new-tokens",
            "6",
            "--dtype",
            "fp32",
            "--compare-plain",
            "--sources",
            "suffix",
        ]
    )
    err = capsys.readouterr().err
    assert code == 0 and "identical output: True" in err and "drafter" not in err.split("rounds (")[1].split(")")[0]
    code = main(
        [
            "generate",
            "--target",
            str(target),
            "--drafter",
            str(drafter),
            "--raw",
            "--prompt",
            "w5 w6 w5 w7 w5",
            "--max-new-tokens",
            "6",
            "--dtype",
            "fp32",
            "--compare-plain",
            "--tree-nodes",
            "0",
        ]
    )
    assert code == 0 and "identical output: True" in capsys.readouterr().err


def test_bench_command_writes_json(model_dirs, tmp_path, capsys):
    import json

    target, drafter = model_dirs
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "w5 w9 w11", "domain": "code"}\n{"prompt": "w7 w8", "domain": "chat"}\n')
    out = tmp_path / "bench.json"
    import torch

    threads = torch.get_num_threads()
    code = main(
        [
            "bench",
            "--target",
            str(target),
            "--drafter",
            str(drafter),
            "--prompts",
            str(prompts),
            "--dtype",
            "fp32",
            "--methods",
            "target,adaflash,adaflash@2,adaflash-drafter,adaflash-suffix,prompt-lookup,dflash-builtin",
            "--max-new-tokens",
            "5",
            "--num-threads",
            "1",
            "--json",
            str(out),
            "--plot",
            str(tmp_path / "acc.png"),
        ]
    )
    torch.set_num_threads(threads)
    assert code == 0
    payload = json.loads(out.read_text())
    results = payload["results"]
    import adaflash_hf

    assert payload["code"]["package_dir"] == str(Path(adaflash_hf.__file__).resolve().parent)  # which code ran
    assert {(r["method"], r["domain"]) for r in results} >= {
        ("adaflash", "all"),
        ("target", "code"),
        ("dflash-builtin", "chat"),
    }
    for r in results:
        assert {
            "method",
            "domain",
            "num_prompts",
            "new_tokens",
            "tokens_per_second",
            "mean_accepted_length",
            "accept_rate",
            "speedup",
            "same_as_target",
        } <= r.keys()
        if r["method"] == "target":
            assert r["mean_accepted_length"] == 1.0 and r["speedup"] == 1.0 and r["same_as_target"] == 1.0
    adaflash = next(r for r in results if r["method"] == "adaflash" and r["domain"] == "all")
    assert adaflash["same_as_target"] == 1.0  # fp32 greedy is lossless
    assert all(a is None or 0.0 <= a <= 1.0 for a in adaflash["position_acceptance"])
    drafter_only = next(r for r in results if r["method"] == "adaflash-drafter" and r["domain"] == "all")
    assert drafter_only["position_acceptance"][3:] == [None] * (
        len(drafter_only["position_acceptance"]) - 3
    )  # block 4: drafts 1..3
    assert set(drafter_only["sources"]) <= {"drafter", "none"} and drafter_only["same_as_target"] == 1.0
    suffix_only = next(r for r in results if r["method"] == "adaflash-suffix" and r["domain"] == "all")
    assert set(suffix_only["sources"]) <= {"suffix", "none"} and suffix_only["same_as_target"] == 1.0
    assert abs(sum(v["round_fraction"] for v in adaflash["sources"].values()) - 1.0) < 1e-3
    short = next(r for r in results if r["method"] == "adaflash@2" and r["domain"] == "all")
    assert short["same_as_target"] == 1.0 and short["mean_accepted_length"] <= 2.0  # verify 2 = anchor + 1 draft
    assert payload["torch_threads"] == 1
    assert (tmp_path / "acc.png").stat().st_size > 0
    assert "speedup" in capsys.readouterr().out


def test_bench_args_validation():
    with pytest.raises(ValueError, match="unknown methods"):
        BenchArgs(methods="target,medusa")
    with pytest.raises(ValueError, match="must include 'target'"):
        BenchArgs(methods="adaflash")
    with pytest.raises(ValueError, match="only adaflash methods take a verify length"):
        BenchArgs(methods="target,assisted@3")
    with pytest.raises(ValueError, match="twice"):
        BenchArgs(methods="target,adaflash,adaflash")
    with pytest.raises(ValueError, match="--round-log .* needs --concurrency"):
        BenchArgs(round_log="rounds.jsonl")


def test_every_command_has_help_with_each_default_once(capsys):
    import argparse

    from adaflash_hf.cli_args import add_dataclass_arguments

    commands = available_commands()
    assert {"generate", "bench", "profile", "generate-data", "prepare-drafter", "train-drafter"} <= commands.keys()
    for name, command in commands.items():
        with pytest.raises(SystemExit) as exit_info:
            main([name, "--help"])
        assert exit_info.value.code == 0
        parser = argparse.ArgumentParser()
        add_dataclass_arguments(parser, command.load("config"))
        for action in parser._actions[1:]:
            assert action.help.count("default") <= 1 and "(default: None)" not in action.help, (name, action.help)
    assert "--max-new-tokens" in capsys.readouterr().out


def test_every_command_takes_the_same_dtype_choices_and_default():
    import dataclasses

    from adaflash_hf.cli_args import DTYPES

    exact = {"soak-opd"}  # compares every output with the target's bit for bit, so fp32 unless told otherwise
    commands = ("generate", "bench", "profile", "generate-data", "train-drafter", "bench-opd", *exact)
    for name in commands:
        config = available_commands()[name].load("config")
        dtype = next(f for f in dataclasses.fields(config) if f.name in ("dtype", "target_dtype"))
        assert dtype.default == ("fp32" if name in exact else "auto") and dtype.metadata["choices"] == DTYPES, name


def test_explain_difference_reports_the_logit_gap(capsys):
    from adaflash_hf.cli import explain_difference

    target = tiny_target("llama")
    explain_difference(target, [5, 6, 7, 8, 9], [5, 6, 7, 8, 10], prompt_len=3)
    err = capsys.readouterr().err
    assert "first differ at new token 1" in err and "gap" in err


def test_bench_pools_position_acceptance_and_leaves_out_unverified_positions():
    from adaflash_hf.bench_report import pooled_position_acceptance

    records = [{"positions": ([1, 0, 0], [2, 1, 0])}, {"positions": ([0, 0, 0], [1, 0, 0])}, {"positions": None}]
    assert pooled_position_acceptance(records) == [round(1 / 3, 4), 0.0, None]  # pooled counts, not a mean of ratios
    assert pooled_position_acceptance([{"positions": None}]) is None


def test_prepare_drafter_attaches_vocabulary_and_datastore_that_load_and_draft(model_dirs, tmp_path, capsys):
    import torch

    from adaflash_hf import generate, load_drafter
    from adaflash_hf.training.data import _write_shard

    target_dir, drafter_dir = model_dirs
    shards = tmp_path / "data" / "train" / "key"
    shards.mkdir(parents=True)
    _write_shard(shards / "shard_00000.safetensors", [([5, 6] + [7, 8, 9, 10] * 10, 2) for _ in range(20)])
    code = main(
        [
            "prepare-drafter",
            "--drafter",
            str(drafter_dir),
            "--output-dir",
            str(tmp_path / "prepared"),
            "--data-dir",
            str(tmp_path / "data"),
            "--target",
            str(target_dir),
            "--size",
            "8",
        ]
    )
    assert code == 0
    assert "held-out coverage" in capsys.readouterr().out
    target = tiny_target("qwen3")
    drafter = load_drafter(str(tmp_path / "prepared"), target)
    assert drafter.config.draft_vocab_size == 8 and {7, 8, 9, 10} <= set(drafter.draft_vocab.tolist())
    assert drafter.adaflash_datastore.num_tokens == 20 * 40
    ids = torch.tensor([[4, 7, 8, 9, 10, 7, 8]])
    out = generate(target, drafter, ids, max_new_tokens=12, eos_token_id=None)
    plain = target.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None)
    assert out.sequences.tolist() == plain.tolist()

    # again from the prepared drafter: its vocabulary kept, plus an acceptance prior from two held-out prompts
    code = main(
        [
            "prepare-drafter",
            "--drafter",
            str(tmp_path / "prepared"),
            "--output-dir",
            str(tmp_path / "calibrated"),
            "--data-dir",
            str(tmp_path / "data"),
            "--target",
            str(target_dir),
            "--keep-vocab",
            "--acceptance-prompts",
            "2",
            "--acceptance-tokens",
            "6",
        ]
    )
    assert code == 0
    calibrated = load_drafter(str(tmp_path / "calibrated"), target)
    assert torch.equal(calibrated.draft_vocab, drafter.draft_vocab)
    assert calibrated.adaflash_acceptance_prior["prompts"] == 2 and calibrated.adaflash_acceptance_prior["entries"]
    assert calibrated.adaflash_datastore.num_tokens == 20 * 40  # the shipped datastore keeps every response
    # sampled answers (generate-data --temperature) stay out of the datastore, the counts and the prior's prompts
    sampled = tmp_path / "data" / "train" / "sampled"
    sampled.mkdir()
    _write_shard(sampled / "shard_00000.safetensors", [([5, 6] + [11, 12] * 10, 2) for _ in range(30)])
    (sampled / "meta.json").write_text(json.dumps({"decoding": "sampled at temperature 0.7 (sample 0)"}))
    main(
        ["prepare-drafter", "--drafter", str(tmp_path / "calibrated"), "--output-dir", str(tmp_path / "again")]
        + ["--data-dir", str(tmp_path / "data"), "--target", str(target_dir), "--keep-vocab"]
    )
    assert load_drafter(str(tmp_path / "again"), target).adaflash_datastore.num_tokens == 20 * 40
    assert (
        main(
            [
                "prepare-drafter",
                "--drafter",
                str(drafter_dir),
                "--output-dir",
                str(tmp_path / "x"),
                "--keep-vocab",
                "--size",
                "8",
                "--data-dir",
                str(tmp_path / "data"),
            ]
        )
        == 2
    )
    assert "keep_vocab keeps the drafter's draft vocabulary" in capsys.readouterr().err


def test_profile_command_splits_the_round(model_dirs, tmp_path, capsys):
    import json

    target, drafter = model_dirs
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "w5 w9 w11", "domain": "code"}\n')
    out = tmp_path / "profile.json"
    assert (
        main(
            [
                "profile",
                "--target",
                str(target),
                "--drafter",
                str(drafter),
                "--prompts",
                str(prompts),
                "--dtype",
                "fp32",
                "--max-new-tokens",
                "8",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    payload = json.loads(out.read_text())
    assert set(payload["forward_ms_by_new_tokens"]) == {"1", "2", "4", "8", "16"}
    for row in payload["engine"].values():
        assert row["round_ms"] >= row["verify_ms"] > 0 and row["propose_ms"] >= 0
    assert "vs plain" in capsys.readouterr().out


def test_prepare_drafter_counts_the_targets_predictions_on_corpus_text(model_dirs, tmp_path, monkeypatch):
    from datasets import Dataset

    import adaflash_hf.data as data

    monkeypatch.setattr(
        data, "load_text_corpus", lambda *a, **k: Dataset.from_dict({"text": ["w5 w6 w7 w8 w9 " * 40] * 30})
    )
    target_dir, drafter_dir = model_dirs
    assert (
        main(
            [
                "prepare-drafter",
                "--drafter",
                str(drafter_dir),
                "--output-dir",
                str(tmp_path / "prepared"),
                "--target",
                str(target_dir),
                "--corpus-tokens",
                "2000",
                "--size",
                "4",
            ]
        )
        == 0
    )
    report = json.loads((tmp_path / "prepared" / "draft_vocab.json").read_text())
    assert report["counted_tokens"] > 1000 and report["datastore_tokens"] == 0  # no responses: no datastore
    assert not (tmp_path / "prepared" / "datastore.safetensors").exists()
    assert AdaFlashDrafter.from_pretrained(tmp_path / "prepared").config.draft_vocab_size == 4


# --------------------------------------------------------------------------------------------
# Fast help: the CLI imports neither torch nor transformers until a command runs
# --------------------------------------------------------------------------------------------

HELP_OF_EVERY_COMMAND = """
import sys
from adaflash_hf.cli import available_commands, main
commands = list(available_commands())
for argv in (["--help"], *([name, "--help"] for name in commands)):
    try:
        main(argv)
    except SystemExit as exit_info:
        assert exit_info.code == 0, argv
    heavy = [m for m in ("torch", "transformers", "accelerate", "datasets") if m in sys.modules]
    assert not heavy, "adaflash " + " ".join(argv) + " imported " + ", ".join(heavy)
print("COMMANDS", " ".join(commands))
"""


def test_help_of_every_command_imports_no_torch_or_transformers():
    """``adaflash --help`` and ``adaflash <command> --help`` for every command (in one fresh process, checked after
    each) import neither torch nor transformers: help loads cli.py, its light helpers and the command's config
    module only, so it is instant. Imports are checked, not time.

    A config dataclass must live where torch is not imported at module level (bench.py, profile.py,
    training/configs.py, training/data_configs.py, online/bench_opd.py), in packages whose ``__init__`` loads
    nothing heavy eagerly.
    """
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", HELP_OF_EVERY_COMMAND], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "usage: adaflash generate" in out.stdout and "--dtype {auto,bf16,fp16,fp32}" in out.stdout
    checked = out.stdout.strip().splitlines()[-1].split()[1:]
    assert checked == list(available_commands())
    assert {"train-drafter", "train-length-head", "generate-data", "prepare-drafter", "bench-opd", "soak-opd"} <= set(
        checked
    )


def test_a_command_whose_module_is_missing_is_hidden(monkeypatch, capsys):
    from adaflash_hf import cli

    monkeypatch.setitem(
        cli.COMMANDS,
        "future",
        cli.Command("adaflash_hf.not_written_yet:Config", "adaflash_hf.not_written_yet:run", "Not written yet."),
    )
    assert "future" not in cli.available_commands() and "generate" in cli.available_commands()
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "generate" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        main(["future"])
    assert exit_info.value.code == 2 and "invalid choice: 'future'" in capsys.readouterr().err


def test_a_command_whose_module_fails_to_import_says_so_in_one_line(monkeypatch, tmp_path, capsys):
    from adaflash_hf import cli

    (tmp_path / "broken_command.py").write_text("import a_dependency_that_is_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.COMMANDS, "broken", cli.Command("broken_command:Config", "broken_command:run", "Broken."))
    assert main(["broken", "--help"]) == 2
    err = capsys.readouterr().err
    assert err == "error: adaflash broken is unavailable: No module named 'a_dependency_that_is_not_installed'\n"
    with pytest.raises(SystemExit) as exit_info:  # the other commands are untouched
        main(["generate", "--help"])
    assert exit_info.value.code == 0


# --------------------------------------------------------------------------------------------
# User errors: one line, exit status 2, no traceback; --debug shows the traceback
# --------------------------------------------------------------------------------------------


def cli_error(argv: list[str], capsys) -> str:
    """Run the CLI on bad input; return its one error line after checking status 2 and no traceback."""
    try:
        code = main(argv)
    except SystemExit as exit_info:  # argparse: usage line + error line
        code = exit_info.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if "error:" in line]  # progress bars and logs may come before it
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["generate", "--temperature", "-1"], "--temperature -1.0: must be >= 0"),
        (["generate", "--max-new-tokens", "0"], "--max-new-tokens 0: ask for at least 1 new token"),
        (["generate", "--max-new-tokens", "-5"], "--max-new-tokens -5: ask for at least 1 new token"),
        (["generate", "--verify-len", "0"], "--verify-len 0: must be >= 1"),
        (["generate", "--prompt", "  "], "--prompt is empty"),
        (["generate", "--sources", "drafter,medusa"], "choose one or more of drafter, suffix, global, datastore"),
        (["generate", "--tree-nodes", "-2"], "--tree-nodes -2: must be >= 0"),
        (["generate", "--dtype", "fp8"], "argument --dtype: invalid choice: 'fp8'"),
        (["generate", "--max-new-tokens", "many"], "argument --max-new-tokens: invalid int value: 'many'"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["bench", "--methods", "target,medusa"], "unknown methods ['medusa']"),
        (["bench", "--methods", "adaflash"], "--methods must include 'target'"),
        (["bench", "--methods", "target,assisted@3"], "only adaflash methods take a verify length"),
        (["bench", "--methods", "target,adaflash,adaflash"], "--methods lists a method twice"),
        (["bench", "--num-threads", "0"], "--num-threads must be >= 1"),
        (["bench", "--prompts", "no/such/prompts.jsonl"], "--prompts no/such/prompts.jsonl: no such file"),
        (["profile", "--max-new-tokens", "4"], "--max-new-tokens 4: profile needs at least 8"),
        (["train-drafter", "--output-dir", "runs/x", "--block-size", "1"], "block_size must be >= 2"),
        (
            ["train-drafter", "--output-dir", "runs/x", "--target-dtype", "int8"],
            "argument --target-dtype: invalid choice: 'int8'",
        ),
        (["train-drafter", "--block-size", "8"], "the following arguments are required: --output-dir"),
        (["generate-data", "--data-dir", "d", "--max-new-tokens", "0"], "max_new_tokens must be >= 1, got 0"),
        (
            ["generate-data", "--data-dir", "d", "--prompts", "no/such/prompts.jsonl"],
            "Prompt file no/such/prompts.jsonl does not exist",
        ),
        (
            ["prepare-drafter", "--drafter", "auto", "--output-dir", "o", "--data-dir", "no/such/data"],
            "data_dir no/such/data: no such folder",
        ),
        (["prepare-drafter", "--drafter", "auto", "--output-dir", "o"], "nothing to count: give data_dir"),
    ],
)
def test_bad_values_get_one_error_line(argv, message, capsys):
    assert message in cli_error(argv, capsys)


def test_bad_models_get_one_error_line(model_dirs, tmp_path, capsys):
    target, drafter = model_dirs
    common = ["--target", str(target), "--raw", "--prompt", "w5 w6", "--max-new-tokens", "2", "--dtype", "fp32"]
    line = cli_error(["generate", *common[:1], str(tmp_path / "missing-target"), *common[2:]], capsys)
    assert line.startswith("error: Unknown target") and "Presets: smollm2-135m" in line
    line = cli_error(["generate", *common, "--drafter", str(tmp_path / "missing")], capsys)
    assert (
        f"error: no drafter folder {tmp_path / 'missing'}: a drafter is 'auto'" in line
        and "Hub id (owner/name)" in line
    )
    (tmp_path / "empty").mkdir()
    assert "has no config.json" in cli_error(["generate", *common, "--drafter", str(tmp_path / "empty")], capsys)
    line = cli_error(["generate", *common, "--drafter", str(target)], capsys)
    assert "holds a `qwen3` model, not a drafter" in line
    line = cli_error(
        ["generate", *common, "--drafter", str(drafter), "--verify-len", "100", "--sources", "drafter"], capsys
    )
    assert (
        "verify_len=100: a round verifies the anchor plus at most 3 drafts (the drafter's block of 4 gives 3), so "
        "choose 1..4" in line
    )
    line = cli_error(["generate", *common, "--drafter", str(drafter), "--verify-len", "100"], capsys)
    assert "at most 16 drafts" in line and "choose 1..17" in line  # suffix matches reach 16 tokens
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "w5 w9", "domain": "code"}\n')
    bench = [
        "bench",
        "--target",
        str(target),
        "--drafter",
        str(drafter),
        "--prompts",
        str(prompts),
        "--dtype",
        "fp32",
        "--json",
        str(tmp_path / "b.json"),
        "--plot",
        "",
    ]
    assert "choose 1..4" in cli_error([*bench, "--methods", "target,adaflash-drafter@9"], capsys)
    assert "no default draft model for" in cli_error([*bench, "--methods", "target,assisted"], capsys)


def test_unexpected_errors_are_one_line_and_debug_shows_the_traceback(monkeypatch, capsys):
    from adaflash_hf import cli

    def broken(config):
        raise RuntimeError("something inside broke\nsecond line")

    monkeypatch.setattr(cli, "run_generate", broken)
    assert main(["generate"]) == 1
    assert capsys.readouterr().err == (
        "error: unexpected RuntimeError: something inside broke (run with --debug for the traceback)\n"
    )
    with pytest.raises(RuntimeError, match="something inside broke"):
        main(["--debug", "generate"])
    with pytest.raises(ValueError, match="--temperature"):
        main(["generate", "--debug", "--temperature", "-1"])  # --debug also works after the command


def test_generate_args_validate_in_the_python_api_too():
    from adaflash_hf.cli import GenerateArgs

    with pytest.raises(ValueError, match="--temperature nan: must be >= 0"):
        GenerateArgs(temperature=float("nan"))
    with pytest.raises(ValueError, match="--dtype 'fp8' is not allowed: choose one of auto, bf16, fp16, fp32"):
        GenerateArgs(dtype="fp8")
    with pytest.raises(ValueError, match="--dtype 'float16' is not allowed"):
        BenchArgs(dtype="float16")


def test_train_drafter_prints_the_folder_it_wrote(monkeypatch, capsys):
    from pathlib import Path

    import adaflash_hf.training.trainer as trainer

    monkeypatch.setattr(trainer, "train_drafter", lambda config: Path(config.output_dir) / "drafter")
    assert main(["train-drafter", "--output-dir", "runs/x"]) == 0
    assert capsys.readouterr().out == "runs/x/drafter\n"


def test_replay_drafter_command_compares_drafters_on_cached_answers(model_dirs, tmp_path, capsys):
    target, drafter = model_dirs
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "w5 w9 w11", "domain": "code"}\n{"prompt": "w7 w8", "domain": "chat"}\n')
    out, answers = tmp_path / "replay.json", tmp_path / "answers"
    args = ["replay-drafter", "--target", str(target), "--drafters", f"{drafter},{drafter}", "--prompts", str(prompts)]
    args += ["--dtype", "fp32", "--max-new-tokens", "6", "--responses-dir", str(answers), "--json", str(out)]
    import torch

    threads = torch.get_num_threads()
    assert main(args) == 0
    torch.set_num_threads(threads)
    results = json.loads(out.read_text())["results"]
    assert [(r["domain"]) for r in results] == ["code", "chat", "all"] * 2
    first, second = results[:3], results[3:]
    assert [{**r, "drafter": ""} for r in first] == [{**r, "drafter": ""} for r in second]  # the same answers
    everything = first[2]
    assert everything["answers"] == 2 and everything["tokens"] == first[0]["tokens"] + first[1]["tokens"]
    assert 1.0 <= everything["tau"] <= 4.0 and len(everything["position_acceptance"]) == 3  # block 4
    assert list(answers.rglob("shard_*.safetensors"))  # cached for the next run
    assert "every anchor" in capsys.readouterr().out
