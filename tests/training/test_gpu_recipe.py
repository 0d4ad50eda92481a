"""The GPU training recipe (``benchmarks/training/gpu_recipe.py``), run end to end on the CPU with a tiny target:
data (greedy, then sampled answers), training on every cached answer, the record and the split export."""

from __future__ import annotations

import importlib.util
import io
import json
import tarfile
from pathlib import Path

import pytest
import torch
from test_training import saved_tiny_target

from adaflash_hf import enable_adaflash, load_drafter

ROOT = Path(__file__).resolve().parents[2]


def recipe_module():
    spec = importlib.util.spec_from_file_location("gpu_recipe", ROOT / "benchmarks" / "training" / "gpu_recipe.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_recipe_generates_trains_on_every_cached_answer_and_exports_a_lossless_drafter(tmp_path):
    target = saved_tiny_target(tmp_path / "target")
    recipe = recipe_module()
    out, exported = tmp_path / "out", tmp_path / "exported"
    # the train-drafter options after "--" shrink the run to a few steps of the tiny model
    code = recipe.main(
        [
            *("--target", str(tmp_path / "target"), "--target-dtype", "fp32"),
            *("--data-dir", str(tmp_path / "data"), "--output-dir", str(out), "--export-dir", str(exported)),
            *("--minutes", "10", "--generate-minutes", "2", "--samples-per-prompt", "2", "--gen-batch-size", "4"),
            *("--train-domains", "math", "--prompts-per-domain", "3", "--max-new-tokens", "6"),
            *("--num-layers", "2", "--block-size", "4", "--batch-size", "2", "--num-anchors", "4"),
            *("--eval-every", "2", "--checkpoint-every", "2", "--max-file-mib", "0.05"),
            *("--", "--max-steps", "4", "--seq-len", "32", "--eval-prompts-per-domain", "2", "--eval-anchors", "4"),
        ]
    )
    assert code == 0
    record = json.loads((out / "recipe.json").read_text())
    assert [c["returncode"] for c in record["commands"]] == [0, 0, 0]  # greedy data, sampled data, training
    assert record["devices"]["kind"] in ("cpu", "cuda") and record["steps"] == 4
    # three prompts answered greedily and sampled twice: training read all nine cached answers
    assert len(list((tmp_path / "data" / "train").glob("*/meta.json"))) == 3
    assert record["data"]["self_gen_sequences"] == 9
    assert record["held_out_final"] is not None

    parts = sorted(exported.glob("drafter.tar.part-*"))
    assert len(parts) > 1 and all(p.stat().st_size <= 0.05 * 2**20 for p in parts)
    with tarfile.open(fileobj=io.BytesIO(b"".join(p.read_bytes() for p in parts))) as tar:
        tar.extractall(tmp_path / "restored", filter="data")
    restored = tmp_path / "restored"
    config = json.loads((restored / "drafter" / "config.json").read_text())
    assert (config["num_hidden_layers"], config["block_size"]) == (2, 4)
    assert any(json.loads(line)["kind"] == "eval" for line in (restored / "metrics.jsonl").read_text().splitlines())
    assert json.loads((restored / "recipe.json").read_text())["steps"] == 4

    # the exported drafter decodes losslessly: fp32 greedy output equals the target's own
    drafter = load_drafter(str(restored / "drafter"), target)
    enable_adaflash(target)
    prompt = torch.tensor([[1, 60, 61, 62, 63, 64, 65]])
    plain = target.generate(prompt, do_sample=False, max_new_tokens=12, pad_token_id=2)
    fast = target.generate(prompt, do_sample=False, max_new_tokens=12, pad_token_id=2, assistant_model=drafter)
    assert torch.equal(plain, fast)


def test_a_data_budget_that_leaves_no_training_time_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        recipe_module().main(["--data-dir", str(tmp_path), "--output-dir", str(tmp_path), "--minutes", "3"])
    assert "--generate-minutes 2.0 leaves no training time within --minutes 3.0" in capsys.readouterr().err
