"""The command line, end to end on a tiny local model folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_integration import word_tokenizer

from adaflash_hf import AdaFlashDrafter
from adaflash_hf.bench import BenchArgs
from adaflash_hf.cli import COMMANDS, main

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
    code = main(["generate", "--target", str(target), "--drafter", str(drafter), "--raw", "--prompt", "w5 w6 w7",
                 "--max-new-tokens", "6", "--dtype", "fp32", "--compare-plain"])
    err = capsys.readouterr().err
    assert code == 0
    assert "tau" in err and "identical output: True" in err
    code = main(["generate", "--target", str(target), "--drafter", str(drafter), "--raw", "--prompt", "w5 w6 w5 w6 w5",
                 "--max-new-tokens", "6", "--dtype", "fp32", "--compare-plain", "--sources", "suffix"])
    err = capsys.readouterr().err
    assert code == 0 and "identical output: True" in err and "drafter" not in err.split("rounds (")[1].split(")")[0]
    with pytest.raises(SystemExit):
        main(["generate", "--target", str(target), "--sources", "drafter,medusa"])
    assert "choose one or more of drafter, suffix, global, datastore" in capsys.readouterr().err


def test_bench_command_writes_json(model_dirs, tmp_path, capsys):
    import json

    target, drafter = model_dirs
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "w5 w9 w11", "domain": "code"}\n{"prompt": "w7 w8", "domain": "chat"}\n')
    out = tmp_path / "bench.json"
    import torch

    threads = torch.get_num_threads()
    code = main(["bench", "--target", str(target), "--drafter", str(drafter), "--prompts", str(prompts), "--dtype", "fp32",
                 "--methods", "target,adaflash,adaflash@2,adaflash-drafter,adaflash-suffix,prompt-lookup,dflash-builtin", "--max-new-tokens", "5", "--num-threads", "1",
                 "--json", str(out), "--plot", str(tmp_path / "acc.png")])
    torch.set_num_threads(threads)
    assert code == 0
    payload = json.loads(out.read_text())
    results = payload["results"]
    import adaflash_hf

    assert payload["code"]["package_dir"] == str(Path(adaflash_hf.__file__).resolve().parent)  # which code ran
    assert {(r["method"], r["domain"]) for r in results} >= {("adaflash", "all"), ("target", "code"), ("dflash-builtin", "chat")}
    for r in results:
        assert {"method", "domain", "num_prompts", "new_tokens", "tokens_per_second", "mean_accepted_length",
                "accept_rate", "speedup", "same_as_target"} <= r.keys()
        if r["method"] == "target":
            assert r["mean_accepted_length"] == 1.0 and r["speedup"] == 1.0 and r["same_as_target"] == 1.0
    adaflash = next(r for r in results if r["method"] == "adaflash" and r["domain"] == "all")
    assert adaflash["same_as_target"] == 1.0  # fp32 greedy is lossless
    assert all(a is None or 0.0 <= a <= 1.0 for a in adaflash["position_acceptance"])
    drafter_only = next(r for r in results if r["method"] == "adaflash-drafter" and r["domain"] == "all")
    assert drafter_only["position_acceptance"][3:] == [None] * (len(drafter_only["position_acceptance"]) - 3)  # block 4: drafts 1..3
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


def test_every_command_has_help(capsys):
    from adaflash_hf.cli import _register_optional_commands

    _register_optional_commands()
    for name in COMMANDS:
        with pytest.raises(SystemExit) as exit_info:
            main([name, "--help"])
        assert exit_info.value.code == 0
    assert "--max-new-tokens" in capsys.readouterr().out


def test_model_card_carries_metadata_results_and_command(model_dirs, tmp_path):
    import json
    from dataclasses import asdict

    from adaflash_hf.model_card import write_model_card
    from adaflash_hf.training.trainer import TrainDrafterConfig

    _, drafter = model_dirs
    recipe = asdict(TrainDrafterConfig(output_dir="runs/x", block_size=8, num_anchors=128))
    summary = {"recipe": recipe, "data_sizes": {"corpus_tokens": 1000}, "steps": 10, "supervised_tokens_seen": 5,
               "wall_minutes": 3.0, "data_minutes": 1.0, "train_minutes": 2.0,
               "held_out_teacher_forced": {"tau": 1.8, "position_acceptance": [0.5, 0.3]},
               "engine_check": {"tau": 1.7, "spec_tokens_per_s": 30.0, "plain_tokens_per_s": 20.0}}
    (drafter / "training_summary.json").write_text(json.dumps(summary))
    card = write_model_card(drafter).read_text()
    assert card.startswith("---\nlibrary_name: adaflash-hf\nbase_model: HuggingFaceTB/SmolLM2-135M-Instruct")
    assert "tau 1.800" in card and "30.0 tok/s speculative vs 20.0" in card
    assert "adaflash train-drafter --output-dir runs/x" in card and "--num-anchors 128" in card
    assert "reduced draft vocabulary" not in card and "greedy responses to training prompts" not in card

    config = json.loads((drafter / "config.json").read_text())
    (drafter / "config.json").write_text(json.dumps({**config, "draft_vocab_size": 16}))
    (drafter / "draft_vocab.json").write_text(json.dumps({"heldout_coverage": 0.975, "datastore_tokens": 1234}))
    summary["recipe"]["init_from"] = "auto"
    summary["held_out_at_init"] = {"tau": 1.5}
    (drafter / "training_summary.json").write_text(json.dumps(summary))
    card = write_model_card(drafter).read_text()
    assert "the 16 most frequent target output tokens, covering 97.50%" in card
    assert "1234 tokens of the target's own greedy responses" in card
    assert "continued from `auto` (held-out tau 1.500 at step 0" in card


def test_explain_difference_reports_the_logit_gap(capsys):
    from adaflash_hf.cli import explain_difference

    target = tiny_target("llama")
    explain_difference(target, [5, 6, 7, 8, 9], [5, 6, 7, 8, 10], prompt_len=3)
    err = capsys.readouterr().err
    assert "first differ at new token 1" in err and "gap" in err


def test_bench_pools_position_acceptance_and_leaves_out_unverified_positions():
    from adaflash_hf.bench import pooled_position_acceptance

    records = [{"positions": ([1, 0, 0], [2, 1, 0])}, {"positions": ([0, 0, 0], [1, 0, 0])}, {"positions": None}]
    assert pooled_position_acceptance(records) == [round(1 / 3, 4), 0.0, None]  # pooled counts, not a mean of ratios
    assert pooled_position_acceptance([{"positions": None}]) is None


def test_model_card_wall_time_says_when_a_run_was_resumed():
    from adaflash_hf.model_card import _wall_time_line

    assert "resumed" in _wall_time_line({"wall_minutes": 20.0, "data_minutes": 0.1, "train_minutes": 60.0})
    assert "63.0 min in all" in _wall_time_line({"wall_minutes": 63.0, "data_minutes": 1.0, "train_minutes": 60.0})


def test_prepare_drafter_attaches_vocabulary_and_datastore_that_load_and_draft(model_dirs, tmp_path, capsys):
    import torch

    from adaflash_hf import generate, load_drafter
    from adaflash_hf.training.data import _write_shard

    target_dir, drafter_dir = model_dirs
    shards = tmp_path / "data" / "train" / "key"
    shards.mkdir(parents=True)
    _write_shard(shards / "shard_00000.safetensors", [([5, 6] + [7, 8, 9, 10] * 10, 2) for _ in range(20)])
    code = main(["prepare-drafter", "--drafter", str(drafter_dir), "--output-dir", str(tmp_path / "prepared"),
                 "--data-dir", str(tmp_path / "data"), "--target", str(target_dir), "--size", "8"])
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


def test_profile_command_splits_the_round(model_dirs, tmp_path, capsys):
    import json

    target, drafter = model_dirs
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "w5 w9 w11", "domain": "code"}\n')
    out = tmp_path / "profile.json"
    assert main(["profile", "--target", str(target), "--drafter", str(drafter), "--prompts", str(prompts), "--dtype", "fp32",
                 "--max-new-tokens", "8", "--json", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert set(payload["forward_ms_by_new_tokens"]) == {"1", "2", "4", "8", "16"}
    for row in payload["engine"].values():
        assert row["round_ms"] >= row["verify_ms"] > 0 and row["propose_ms"] >= 0
    assert "vs plain" in capsys.readouterr().out


def test_prepare_drafter_counts_the_targets_predictions_on_corpus_text(model_dirs, tmp_path, monkeypatch):
    from datasets import Dataset

    import adaflash_hf.data as data

    monkeypatch.setattr(data, "load_text_corpus", lambda *a, **k: Dataset.from_dict({"text": ["w5 w6 w7 w8 w9 " * 40] * 30}))
    target_dir, drafter_dir = model_dirs
    assert main(["prepare-drafter", "--drafter", str(drafter_dir), "--output-dir", str(tmp_path / "prepared"),
                 "--target", str(target_dir), "--corpus-tokens", "2000", "--size", "4"]) == 0
    report = json.loads((tmp_path / "prepared" / "draft_vocab.json").read_text())
    assert report["counted_tokens"] > 1000 and report["datastore_tokens"] == 0  # no responses: no datastore
    assert not (tmp_path / "prepared" / "datastore.safetensors").exists()
    assert AdaFlashDrafter.from_pretrained(tmp_path / "prepared").config.draft_vocab_size == 4
