"""``adaflash export``: the DFlash layout vLLM and SGLang read, its round trip, what it cannot carry, bad inputs."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from test_cli import cli_error
from test_integration import word_tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

from adaflash_hf import AdaFlashDrafter, generate
from adaflash_hf.cli import main
from adaflash_hf.dflash_format import save_dflash_checkpoint
from adaflash_hf.drafters import BUNDLED_DIR, bundled_presets
from adaflash_hf.export import MARKER, ExportArgs, export_drafter
from adaflash_hf.export_target import card_base_model
from adaflash_hf.targets import MARKER as PRESET_MARKER
from adaflash_hf.targets import PRESETS, preset_folder

from conftest import drafter_only, greedy_reference, random_prompts, tiny_target

BLOCK = 5


@pytest.fixture
def pair(tmp_path):
    """A tiny target folder (with tokenizer) and a drafter folder whose training summary names that target."""
    target = tiny_target("qwen3")
    target.save_pretrained(tmp_path / "target")
    word_tokenizer().save_pretrained(tmp_path / "target")
    torch.manual_seed(1)
    drafter = AdaFlashDrafter.from_target(target, num_layers=2, block_size=BLOCK).eval()
    drafter.save_pretrained(tmp_path / "drafter")
    summary = {"recipe": {"target": str(tmp_path / "target")}}
    (tmp_path / "drafter" / "training_summary.json").write_text(json.dumps(summary))
    return target, drafter, tmp_path / "target", tmp_path / "drafter"


def same_weights(a, b) -> bool:
    sa = {k: v for k, v in a.state_dict().items() if k != "draft_vocab"}
    sb = b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_the_export_round_trips_and_prints_the_serving_lines(pair, tmp_path, capsys):
    target, drafter, target_dir, drafter_dir = pair
    out = tmp_path / "export"
    assert main(["export", str(drafter_dir), str(out), "--format", "dflash", "--dtype", "fp32"]) == 0
    printed, err = capsys.readouterr()
    assert "warning" not in err  # nothing the layout cannot carry
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["block_size"] == BLOCK
    assert config["dflash_config"] == {"mask_token_id": drafter.config.mask_token_id, "target_layer_ids": [0, 3]}
    assert config["dtype"] == "float32"
    assert json.loads((out / MARKER).read_text())["role"] == "drafter"
    spec = json.dumps({"method": "dflash", "model": str(out), "num_speculative_tokens": BLOCK - 1})
    assert f"num_speculative_tokens = block_size - 1 = {BLOCK - 1}" in printed
    assert f"python -m vllm.entrypoints.openai.api_server --model {target_dir} --speculative-config '{spec}'" in printed
    assert f"vllm serve {target_dir} --speculative-config '{spec}'" in printed
    assert f'LLM(model="{target_dir}", speculative_config={spec})' in printed
    assert (
        f"python -m sglang.launch_server --model-path {target_dir} --speculative-algorithm DFLASH "
        f"--speculative-draft-model-path {out} --speculative-num-draft-tokens {BLOCK}"
    ) in printed
    # read back: the same weights, the same speculative outputs, which are the target's own greedy outputs
    loaded = AdaFlashDrafter.from_pretrained(out).eval()
    assert same_weights(drafter, loaded)
    for prompt in random_prompts((4, 9), seed=3):
        ids = torch.tensor([prompt])
        a = generate(target, drafter, ids, max_new_tokens=10, eos_token_id=None, **drafter_only())
        b = generate(target, loaded, ids, max_new_tokens=10, eos_token_id=None, **drafter_only())
        assert torch.equal(a.sequences, b.sequences)
        assert [r.accept_lengths for r in a.stats.rounds] == [r.accept_lengths for r in b.stats.rounds]
        assert b.sequences[0].tolist() == greedy_reference(target, prompt, 10, eos=False)
    # an earlier export is replaced without --overwrite, and exports again knowing its target
    assert main(["export", str(drafter_dir), str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    capsys.readouterr()
    assert main(["export", str(out), str(tmp_path / "again")]) == 0
    assert f"--model-path {target_dir} " in capsys.readouterr().out


def test_what_the_layout_cannot_carry_is_named(pair, tmp_path, capsys):
    _, drafter, _, _ = pair
    drafter.set_draft_vocab(list(range(10, 20)))
    folder = tmp_path / "rich-drafter"
    drafter.save_pretrained(folder)
    (folder / "datastore.safetensors").write_bytes(b"only its presence is read")
    (folder / "acceptance_prior.json").write_text("{}")
    out = tmp_path / "export"
    assert main(["export", str(folder), str(out), "--dtype", "fp32"]) == 0
    printed, err = capsys.readouterr()
    assert "warning: reduced draft vocabulary (10 of 48 tokens)" in err and "full target vocabulary" in err
    assert "warning: datastore" in err and "`ngram`" in err and "`suffix`" in err
    assert "warning: adaptive verify length (the acceptance prior" in err and "num_speculative_tokens = 4" in err
    assert "does not say which target it was trained for" in err  # no summary, no card: the target is unknown
    assert "--model TARGET --speculative-config" in printed
    loaded = AdaFlashDrafter.from_pretrained(out)
    assert loaded.draft_vocab is None and same_weights(drafter, loaded)


def test_every_bundled_drafter_exports_and_reads_back_with_identical_weights(tmp_path, monkeypatch):
    monkeypatch.setenv("ADAFLASH_HOME", str(tmp_path / "home"))
    converted = "smollm2-135m"  # pretend this preset is converted here (its config only), the others not
    folder = preset_folder(converted)
    LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9
    ).save_pretrained(folder)
    files = {"config.json": (folder / "config.json").stat().st_size}
    marker = {"preset": converted, "gguf_sha256": PRESETS[converted].gguf_sha256, "files": files}
    (folder / PRESET_MARKER).write_text(json.dumps(marker))
    presets = bundled_presets()
    assert {"smollm2-135m", "qwen2.5-coder-1.5b"} <= set(presets)
    for preset in presets:
        export = export_drafter(ExportArgs(preset, str(tmp_path / preset)))
        original = AdaFlashDrafter.from_pretrained(BUNDLED_DIR / preset, dtype=torch.bfloat16)
        assert same_weights(original, AdaFlashDrafter.from_pretrained(export.out, dtype=torch.bfloat16))
        assert export.num_speculative_tokens == original.config.block_size - 1
        assert f'"num_speculative_tokens": {export.num_speculative_tokens}' in export.commands()["vllm"]
        assert export.target == preset and export.model == str(preset_folder(preset))
        notes = " ".join(export.notes)
        assert PRESETS[preset].hub_id in notes
        if preset == converted:
            assert f"converted on this machine to {folder}" in notes
        else:
            assert "not converted on this machine yet" in notes and f"prepare_preset('{preset}')" in notes
        warnings = " ".join(export.warnings)
        assert "reduced draft vocabulary" in warnings and "datastore" in warnings
        assert f"the length head bundled as {preset}-length-head" in warnings


def test_target_out_writes_a_folder_the_engines_load(pair, tmp_path, capsys):
    target, _, target_dir, drafter_dir = pair
    out, target_out = tmp_path / "export", tmp_path / "served-target"
    assert main(["export", str(drafter_dir), str(out), "--target-out", str(target_out), "--dtype", "fp32"]) == 0
    assert f"--model {target_out} --speculative-config" in capsys.readouterr().out
    written = AutoModelForCausalLM.from_pretrained(target_out)
    weights = written.state_dict()
    assert all(torch.equal(weights[name], weight) for name, weight in target.state_dict().items())
    assert AutoTokenizer.from_pretrained(target_out)("w5 w6").input_ids == [5, 6]
    assert json.loads((target_out / MARKER).read_text())["role"] == "target"


def test_an_opd_adapter_is_merged_before_the_export(pair, tmp_path, capsys):
    pytest.importorskip("peft")
    from adaflash_hf.online.adapters import LoraSettings, adapter_state, attach_lora, merge_adapter, publish_adapter

    _, drafter, _, drafter_dir = pair
    serving = attach_lora(copy.deepcopy(drafter), LoraSettings(rank=4))
    with torch.no_grad():
        for name, weight in serving.named_parameters():
            if "lora_B" in name:
                weight.normal_()  # zero-initialised: a trained adapter changes the weights
    publish = tmp_path / "opd"
    publish_adapter(publish, 1, adapter_state(serving), LoraSettings(rank=4), str(drafter_dir))
    out = tmp_path / "export"
    assert main(["export", str(drafter_dir), str(out), "--adapter", str(publish), "--dtype", "fp32"]) == 0
    assert f"the OPD adapter {publish / 'v0001'} merged in" in capsys.readouterr().out
    merged = merge_adapter(drafter, publish / "v0001")
    loaded = AdaFlashDrafter.from_pretrained(out)
    assert same_weights(merged, loaded) and not same_weights(drafter, loaded)
    line = cli_error(["export", str(publish), str(tmp_path / "x")], capsys)
    assert "is an OPD publish folder, not a drafter" in line and f"--adapter {publish}" in line
    line = cli_error(["export", str(publish / "v0001"), str(tmp_path / "x")], capsys)
    assert "is a LoRA adapter, not a drafter" in line
    with pytest.raises(ValueError, match="LoRA layers are injected"):
        save_dflash_checkpoint(serving, tmp_path / "serving")


def test_a_drafter_the_layout_cannot_carry_is_refused(pair, tmp_path):
    target, _, _, _ = pair
    with pytest.raises(ValueError, match="qk_norm=False: DFlash readers build Qwen3 layers"):
        save_dflash_checkpoint(AdaFlashDrafter.from_target(target, qk_norm=False), tmp_path / "a")
    with pytest.raises(ValueError, match="hidden_act='gelu'"):
        save_dflash_checkpoint(AdaFlashDrafter.from_target(target, hidden_act="gelu"), tmp_path / "b")


def test_bad_export_inputs_get_one_error_line(pair, tmp_path, capsys, monkeypatch):
    target, _, target_dir, drafter_dir = pair
    export = ["export", str(drafter_dir)]
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    assert "is not empty and holds no earlier adaflash export" in cli_error([*export, str(tmp_path / "busy")], capsys)
    assert (tmp_path / "busy" / "notes.txt").is_file()
    assert main([*export, str(tmp_path / "busy"), "--overwrite"]) == 0  # asked for: replaced
    assert not (tmp_path / "busy" / "notes.txt").exists()
    monkeypatch.chdir(tmp_path / "busy")  # an export replaces its folder as a whole: never the working folder
    for folder in (str(tmp_path), "."):
        assert "is the home folder, the working folder or a folder above it" in cli_error(
            [*export, folder, "--overwrite"], capsys
        )
    assert "is a file: give a folder" in cli_error([*export, str(tmp_path / "busy" / "config.json")], capsys)
    for name in ("fresh", "auto"):
        assert "export needs a trained drafter" in cli_error(["export", name, str(tmp_path / "x")], capsys)
    line = cli_error(["export", str(tmp_path / "missing"), str(tmp_path / "x")], capsys)
    assert (
        "no drafter folder" in line
        and "export takes a preset with a bundled drafter (qwen2.5-coder-1.5b, smollm2-135m)" in line
    )
    assert "would be replaced by the export" in cli_error([*export, str(drafter_dir / "export")], capsys)
    line = cli_error([*export, str(tmp_path / "x"), "--target-out", str(tmp_path / "x" / "target")], capsys)
    assert "overlap: write the target and the drafter to two separate folders" in line
    assert "invalid choice: 'onnx'" in cli_error([*export, str(tmp_path / "x"), "--format", "onnx"], capsys)
    AdaFlashDrafter.from_target(target, qk_norm=False).save_pretrained(tmp_path / "no-qk-norm")
    line = cli_error(["export", str(tmp_path / "no-qk-norm"), str(tmp_path / "x")], capsys)
    assert "cannot be written in the DFlash layout: qk_norm=False" in line and not (tmp_path / "x").exists()
    other = tiny_target("llama")
    other.config.hidden_size = 32  # a config is all the check reads
    other.config.save_pretrained(tmp_path / "other-target")
    line = cli_error([*export, str(tmp_path / "x"), "--target", str(tmp_path / "other-target")], capsys)
    assert f"does not fit the target {tmp_path / 'other-target'}: hidden size: drafter 64 vs target 32" in line
    (drafter_dir / "training_summary.json").unlink()  # now nothing names the target
    line = cli_error([*export, str(tmp_path / "x"), "--target-out", str(tmp_path / "t")], capsys)
    assert "--target-out needs the target" in line and "--target" in line


def test_the_model_card_names_the_target():
    assert card_base_model("---\nbase_model: Qwen/Qwen3-8B\ntags:\n- dflash\n---\n# card") == "Qwen/Qwen3-8B"
    assert card_base_model("---\nbase_model:\n- 'org/model'\n---\n") == "org/model"
    assert card_base_model("# no front matter\nbase_model: x/y") is None


def test_positional_arguments_rebuild_the_command_line(tmp_path):
    from adaflash_hf.cli_args import command_line

    args = ExportArgs("smollm2-135m", str(tmp_path / "my export"), dtype="fp32")
    assert command_line("export", args) == f"adaflash export smollm2-135m '{tmp_path / 'my export'}' --dtype fp32"
