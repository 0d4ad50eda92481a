"""Bad input gets a clear error naming the offending values, before any tensor reaches torch."""

from __future__ import annotations

import pytest
import torch

from adaflash_hf import AdaFlashDrafter, AdaFlashDrafterConfig, enable_adaflash, generate

from conftest import left_pad, random_prompts, tiny_target


def test_drafter_target_mismatches(target, drafter):
    other = tiny_target("llama")
    other.resize_token_embeddings(64)
    with pytest.raises(ValueError, match=r"vocabulary: drafter 48 vs target 64"):
        generate(other, drafter, torch.tensor([[5, 6]]), max_new_tokens=2)
    wide = AdaFlashDrafter(AdaFlashDrafterConfig(**{**drafter.config.to_dict(), "hidden_size": 32, "head_dim": 8}))
    with pytest.raises(ValueError, match=r"hidden size: drafter 32 vs target 64"):
        generate(target, wide, torch.tensor([[5, 6]]), max_new_tokens=2)
    deep = AdaFlashDrafter(
        AdaFlashDrafterConfig(**{**drafter.config.to_dict(), "target_layer_ids": [1, 9], "num_target_layers": None})
    )
    with pytest.raises(ValueError, match=r"target_layer_ids \[9\] out of range for a target with 4 layers"):
        generate(target, deep, torch.tensor([[5, 6]]), max_new_tokens=2)
    with pytest.raises(TypeError, match="not an AdaFlashDrafter"):
        generate(target, other, torch.tensor([[5, 6]]), max_new_tokens=2)


def test_config_validation():
    with pytest.raises(ValueError, match="block_size=1"):
        AdaFlashDrafterConfig(vocab_size=10, hidden_size=8, num_attention_heads=2, block_size=1)
    with pytest.raises(ValueError, match="mask_token_id=10 is outside the vocabulary"):
        AdaFlashDrafterConfig(vocab_size=10, hidden_size=8, num_attention_heads=2, mask_token_id=10)
    with pytest.raises(ValueError, match=r"target_layer_ids \[7\] are out of range"):
        AdaFlashDrafterConfig(
            vocab_size=10, hidden_size=8, num_attention_heads=2, target_layer_ids=[7], num_target_layers=4
        )


def test_tokenizer_mismatch(target, drafter):
    class BigTokenizer:
        def __len__(self):
            return 1000

    with pytest.raises(ValueError, match="tokenizer has 1000 tokens"):
        generate(target, drafter, torch.tensor([[5, 6]]), max_new_tokens=2, tokenizer=BigTokenizer())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(max_new_tokens=4, num_beams=2), "beam search"),
        (dict(max_new_tokens=4, do_sample=True, num_return_sequences=2), "num_return_sequences=2"),
        (dict(max_new_tokens=4, repetition_penalty=1.3), "repetition_penalty"),
        (dict(max_new_tokens=4, do_sample=True, temperature=0.0), "temperature"),
    ],
)
def test_unsupported_generation_modes(target, drafter, kwargs, match):
    with pytest.raises(ValueError, match=match):
        generate(target, drafter, torch.tensor([[5, 6, 7]]), **kwargs)


def test_unknown_argument(target, drafter):
    with pytest.raises(TypeError, match="unknown arguments"):
        generate(target, drafter, torch.tensor([[5, 6, 7]]), max_new_tokens=3, max_new_tokenz=4)


def test_prompt_problems(target, drafter):
    with pytest.raises(ValueError, match="empty prompt"):
        generate(target, drafter, torch.zeros(1, 0, dtype=torch.long), max_new_tokens=2)
    ids, mask = left_pad(random_prompts((3, 5)))
    with pytest.raises(ValueError, match="needs an attention_mask"):
        generate(target, drafter, ids, max_new_tokens=2)
    mask[0] = 0
    with pytest.raises(ValueError, match=r"prompt rows \[0\] are empty"):
        generate(target, drafter, ids, mask, max_new_tokens=2)
    with pytest.raises(ValueError, match="right-padded"):
        generate(target, drafter, ids, torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]), max_new_tokens=2)
    with pytest.raises(ValueError, match="2-D LongTensor"):
        generate(target, drafter, [5, 6, 7], max_new_tokens=2)


def test_enable_adaflash_rejects_non_models():
    with pytest.raises(TypeError, match="generative model"):
        enable_adaflash(object())


def test_drafter_on_other_device_or_dtype_is_reported(target, drafter):
    enable_adaflash(target)
    wrong = drafter.to(torch.float64)
    with pytest.raises(ValueError, match="dtype"):
        target.generate(torch.tensor([[5, 6, 7]]), assistant_model=wrong, max_new_tokens=3)


def test_token_ids_outside_the_vocabulary_are_named():
    from adaflash_hf.checks import check_prompt_batch

    ids = torch.tensor([[5, 6, 7], [8, 99, 100]])
    mask = torch.ones_like(ids)
    with pytest.raises(
        ValueError,
        match=r"token id 99 \(row 1, position 1; 2 such ids in all\) is outside the target's "
        r"vocabulary of 48 ids \[0, 48\)",
    ):
        check_prompt_batch(ids, mask, vocab_size=48)
    with pytest.raises(ValueError, match=r"token id -1 \(row 0, position 0\)"):
        check_prompt_batch(torch.tensor([[-1, 5]]), None, vocab_size=48)
    assert check_prompt_batch(ids, mask).equal(mask)  # without vocab_size nothing is checked
    with pytest.raises(ValueError, match="integer token ids.*torch.float32"):
        check_prompt_batch(torch.tensor([[5.0, 6.0]]), None)


def test_token_ids_outside_the_vocabulary_through_transformers_generate(target, drafter):
    enable_adaflash(target)
    with pytest.raises(
        ValueError, match=r"token id 4000 \(row 0, position 1\) is outside the target's vocabulary of 48"
    ):
        target.generate(torch.tensor([[5, 4000, 7]]), assistant_model=drafter, max_new_tokens=3)


def test_beam_search_with_an_adaflash_drafter_is_refused(target, drafter):
    enable_adaflash(target)
    with pytest.raises(ValueError, match="num_beams=2 asks for beam search, which an AdaFlash drafter cannot speed up"):
        target.generate(torch.tensor([[5, 6, 7]]), assistant_model=drafter, max_new_tokens=3, num_beams=2)
    target.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=3, num_beams=2)  # beam search alone is untouched


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(do_sample=True, top_p=1.5), r"top_p=1.5: must be in \(0, 1\]"),
        (dict(do_sample=True, top_p=0.0), "top_p=0.0"),
        (dict(do_sample=True, temperature=-1.0), "temperature=-1.0: sampling needs temperature > 0"),
        (dict(do_sample=True, top_k=-3), "top_k=-3"),
    ],
)
def test_out_of_range_sampling_values(target, drafter, kwargs, match):
    with pytest.raises(ValueError, match=match):
        generate(target, drafter, torch.tensor([[5, 6, 7]]), max_new_tokens=3, **kwargs)


def test_a_corrupt_drafter_checkpoint_says_so(target, tmp_path):
    from adaflash_hf import AdaFlashDrafter, load_drafter

    AdaFlashDrafter.from_target(target, num_layers=1, block_size=4).save_pretrained(tmp_path / "drafter")
    weights = tmp_path / "drafter" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # a download cut short
    with pytest.raises(OSError, match="drafter weights in .* cannot be read .*corrupt or was only partly downloaded"):
        load_drafter(str(tmp_path / "drafter"), target)


def test_load_drafter_says_what_it_accepts(target, tmp_path):
    from adaflash_hf import load_drafter

    with pytest.raises(
        FileNotFoundError,
        match=r"no drafter folder .*nope: a drafter is 'auto' \(the bundled drafter of a "
        r"preset target: .*smollm2-135m\), 'fresh' .*, a local folder with "
        r"config.json, or a Hub id \(owner/name\)",
    ):
        load_drafter(str(tmp_path / "nope"), target)
    with pytest.raises(FileNotFoundError, match="no drafter folder ./runs/nope"):
        load_drafter("./runs/nope", target)  # looks like owner/name, but a relative path is never a Hub id
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        load_drafter(str(tmp_path / "empty"), target)
    (tmp_path / "file.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="is a file, not a folder"):
        load_drafter(str(tmp_path / "file.bin"), target)


def test_a_drafter_folder_under_home_keeps_its_datastore(drafter, target, tmp_path, monkeypatch):
    """``~/...`` (as in a comma-separated list, where no shell expands it) names the folder and the files beside
    its weights alike (the datastore was looked up on the Hub before)."""
    from adaflash_hf import load_drafter
    from adaflash_hf.decoding.datastore_file import save_datastore

    monkeypatch.setenv("HOME", str(tmp_path))
    drafter.save_pretrained(tmp_path / "runs" / "d")
    save_datastore([[5, 6, 7, 8, 5, 6, 7, 9]], tmp_path / "runs" / "d" / "datastore.safetensors")
    loaded = load_drafter("~/runs/d", target)
    assert loaded.adaflash_datastore.num_tokens == 8


def test_a_drafter_config_missing_fields_names_them(drafter, tmp_path):
    import json

    drafter.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["hidden_size"], config["num_key_value_heads"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ValueError,
        match=f"the drafter config in {tmp_path} lacks hidden_size, num_key_value_heads: these fields fix the shapes",
    ):
        AdaFlashDrafter.from_pretrained(tmp_path)


def test_a_model_that_is_not_a_drafter_is_named(target, tmp_path):
    target.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=f"{tmp_path} holds a `{target.config.model_type}` model, not a drafter"):
        AdaFlashDrafter.from_pretrained(tmp_path)


def test_reloading_an_exported_dflash_folder_warns_nothing(drafter, tmp_path, caplog):
    import logging

    from transformers.utils import logging as hf_logging

    from adaflash_hf.dflash_format import save_dflash_checkpoint

    save_dflash_checkpoint(drafter, tmp_path, dtype=torch.float32)
    hf_logging.enable_propagation()  # let caplog see transformers' warnings
    try:
        with caplog.at_level(logging.WARNING, logger="transformers"):
            loaded = AdaFlashDrafter.from_pretrained(tmp_path)
    finally:
        hf_logging.disable_propagation()
    assert "You are using a model of type" not in caplog.text
    assert loaded.config.model_type == "adaflash_drafter" and loaded.config.block_size == drafter.config.block_size


def test_chat_prompt_ids_refuses_what_it_cannot_encode():
    from test_integration import word_tokenizer

    from adaflash_hf.prompting import chat_prompt_ids

    tokenizer = word_tokenizer()  # no chat template: text is tokenized as is
    assert chat_prompt_ids(tokenizer, "w5 w6") == [5, 6]
    with pytest.raises(ValueError, match="the prompt is empty"):
        chat_prompt_ids(tokenizer, "")
    with pytest.raises(ValueError, match="no chat template"):
        chat_prompt_ids(tokenizer, [{"role": "user", "content": "w5"}])
    with pytest.raises(ValueError, match="non-empty list of"):
        chat_prompt_ids(tokenizer, [{"text": "w5"}])


def test_every_row_of_the_bad_inputs_table_names_a_real_test():
    import re
    from pathlib import Path

    here = Path(__file__).parent
    named = re.findall(r"`((?:\w+/)*test_\w+\.py)::(test_\w+)`", (here / "BAD_INPUTS.md").read_text())
    assert len(named) >= 25
    for file, test in named:
        path = next(here.rglob(file), here / file)  # tests of a subpackage live in its folder (tests/decoding/)
        assert f"def {test}(" in path.read_text(), f"BAD_INPUTS.md names {file}::{test}, which does not exist"


def test_a_device_this_machine_lacks_is_named_before_anything_loads():
    from adaflash_hf import load_target
    from adaflash_hf.checks import check_device

    with pytest.raises(ValueError, match="not a device torch knows"):
        load_target("smollm2-135m", device="gpu")
    missing = f"cuda:{torch.cuda.device_count()}"  # one past the last GPU (cuda:0 on a CPU-only machine)
    with pytest.raises(ValueError, match="is not available: this machine has"):
        load_target("smollm2-135m", device=missing)
    assert check_device("cpu") == torch.device("cpu")
