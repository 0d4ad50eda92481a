"""Save/load round trips: our layout, the z-lab DFlash layout, and Hub remote code in a fresh process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from transformers import AutoModel

from adaflash_hf import AdaFlashDrafter, generate
from adaflash_hf.dflash_format import save_dflash_checkpoint

from conftest import drafter_only, left_pad, random_prompts


def same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_save_load_round_trip(target, drafter, tmp_path):
    drafter.save_pretrained(tmp_path)
    assert {"config.json", "model.safetensors", "modeling_adaflash.py", "configuration_adaflash.py"} <= {
        p.name for p in tmp_path.iterdir()
    }
    loaded = AdaFlashDrafter.from_pretrained(tmp_path)
    assert same_weights(loaded, drafter)
    assert AutoModel.from_pretrained(tmp_path).__class__ is AdaFlashDrafter
    ids, mask = left_pad(random_prompts((3, 6)))
    a = generate(target, drafter, ids, mask, max_new_tokens=6, eos_token_id=None, **drafter_only())
    b = generate(target, loaded.eval(), ids, mask, max_new_tokens=6, eos_token_id=None, **drafter_only())
    assert torch.equal(a.sequences, b.sequences)
    assert [r.accept_lengths for r in a.stats.rounds] == [r.accept_lengths for r in b.stats.rounds]


def test_weights_never_include_target_embeddings(drafter):
    names = drafter.state_dict().keys()
    assert not any("embed" in n or "lm_head" in n for n in names)
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.0.self_attn.q_proj.weight"} <= set(names)


def test_dflash_layout_round_trip(drafter, tmp_path):
    save_dflash_checkpoint(drafter, tmp_path, dtype=torch.float32)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    assert config["dflash_config"] == {
        "mask_token_id": drafter.config.mask_token_id,
        "target_layer_ids": drafter.config.target_layer_ids,
    }
    assert config["block_size"] == drafter.config.block_size
    loaded = AdaFlashDrafter.from_pretrained(tmp_path)
    assert loaded.config.model_type == "adaflash_drafter"
    assert loaded.config.target_layer_ids == drafter.config.target_layer_ids
    assert same_weights(loaded, drafter)


def test_remote_code_loads_in_a_fresh_process_without_adaflash(drafter, tmp_path):
    drafter.save_pretrained(tmp_path)
    torch.save(drafter.state_dict()["fc.weight"], tmp_path / "fc.pt")
    script = (
        "import sys, torch\n"
        "from transformers import AutoModel\n"
        f"m = AutoModel.from_pretrained({str(tmp_path)!r}, trust_remote_code=True)\n"
        "assert 'adaflash_hf' not in sys.modules, 'adaflash_hf must not be needed'\n"
        f"assert torch.equal(m.state_dict()['fc.weight'], torch.load({str(tmp_path / 'fc.pt')!r}))\n"
        "print(type(m).__module__)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "transformers_modules" in result.stdout


def test_remote_code_drafter_works_with_enable_adaflash(target, drafter, tmp_path):
    from adaflash_hf import enable_adaflash

    drafter.save_pretrained(tmp_path)
    remote = AutoModel.from_pretrained(tmp_path, trust_remote_code=True).eval()
    ids = torch.tensor([random_prompts((5,))[0]])
    enable_adaflash(target)
    assert torch.equal(
        target.generate(ids, assistant_model=remote, max_new_tokens=8, do_sample=False),
        target.generate(ids, max_new_tokens=8, do_sample=False),
    )


def test_corrupt_checkpoint_gives_clear_error(drafter, tmp_path):
    drafter.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(OSError, match="corrupt"):
        AdaFlashDrafter.from_pretrained(tmp_path)


def test_checkpoint_missing_a_weight_is_refused(drafter, tmp_path):
    from safetensors.torch import load_file, save_file

    drafter.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    weights.pop("fc.weight")
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="fc.weight"):
        AdaFlashDrafter.from_pretrained(tmp_path)


def test_incomplete_checkpoint_missing_weights(drafter, tmp_path):
    drafter.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(OSError, match="model.safetensors|pytorch_model.bin|no file named"):
        AdaFlashDrafter.from_pretrained(tmp_path)


def test_load_drafter_resolves_bundled_fresh_and_paths(target, drafter, tmp_path, monkeypatch):
    from adaflash_hf import drafters

    monkeypatch.setattr(drafters, "BUNDLED_DIR", tmp_path / "bundled")
    fresh = drafters.load_drafter("auto", target, target_name="tiny")  # nothing bundled: a fresh drafter
    assert fresh.config.hidden_size == target.config.hidden_size and not fresh.training
    drafter.save_pretrained(tmp_path / "bundled" / "tiny")
    assert same_weights(drafters.load_drafter("auto", target, target_name="tiny"), drafter)
    assert same_weights(drafters.load_drafter(str(tmp_path / "bundled" / "tiny"), target), drafter)
    assert drafters.load_drafter("fresh", target).dtype == target.dtype


def test_loads_a_published_style_dflash_checkpoint(tmp_path):
    """A config written the way the z-lab Hub checkpoints are (transformers 4.x Qwen3 style) loads unchanged."""
    from safetensors.torch import save_file

    hidden, heads, kv, head_dim, inter = 32, 4, 2, 8, 48
    config = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "block_size": 16,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "dflash_config": {"mask_token_id": 90, "target_layer_ids": [1, 3]},
        "head_dim": head_dim,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": inter,
        "layer_types": ["full_attention"],
        "max_position_embeddings": 4096,
        "max_window_layers": 1,
        "num_attention_heads": heads,
        "num_hidden_layers": 1,
        "num_key_value_heads": kv,
        "num_target_layers": 6,
        "rms_norm_eps": 1e-6,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.57.1",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 96,
    }
    g = torch.Generator().manual_seed(0)
    shapes = {
        "fc.weight": (hidden, 2 * hidden),
        "hidden_norm.weight": (hidden,),
        "norm.weight": (hidden,),
        "layers.0.input_layernorm.weight": (hidden,),
        "layers.0.post_attention_layernorm.weight": (hidden,),
        "layers.0.self_attn.q_proj.weight": (heads * head_dim, hidden),
        "layers.0.self_attn.k_proj.weight": (kv * head_dim, hidden),
        "layers.0.self_attn.v_proj.weight": (kv * head_dim, hidden),
        "layers.0.self_attn.o_proj.weight": (hidden, heads * head_dim),
        "layers.0.self_attn.q_norm.weight": (head_dim,),
        "layers.0.self_attn.k_norm.weight": (head_dim,),
        "layers.0.mlp.gate_proj.weight": (inter, hidden),
        "layers.0.mlp.up_proj.weight": (inter, hidden),
        "layers.0.mlp.down_proj.weight": (hidden, inter),
    }
    weights = {name: torch.randn(shape, generator=g).to(torch.bfloat16) for name, shape in shapes.items()}
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "config.json").write_text(json.dumps(config))
    drafter = AdaFlashDrafter.from_pretrained(tmp_path)
    assert drafter.config.mask_token_id == 90 and drafter.config.target_layer_ids == [1, 3]
    assert drafter.config.block_size == 16 and drafter.config.rope_parameters["rope_theta"] == 1000000.0
    assert all(torch.equal(drafter.state_dict()[k], weights[k]) for k in weights)


def test_bundled_drafters_are_current_and_load():
    """Bundled Hub-ready folders carry copies of the remote-code files: they must match the library."""
    from pathlib import Path

    import adaflash_hf
    from adaflash_hf.drafters import BUNDLED_DIR, LENGTH_HEAD_SUFFIX

    library = Path(adaflash_hf.__file__).parent
    folders = [
        p for p in BUNDLED_DIR.iterdir() if (p / "config.json").is_file() and not p.name.endswith(LENGTH_HEAD_SUFFIX)
    ]
    assert folders, "no bundled drafter"
    for folder in folders:
        for name in ("modeling_adaflash.py", "configuration_adaflash.py"):
            assert (folder / name).read_text() == (library / name).read_text(), f"{folder / name} is stale: re-save it"
        config = json.loads((folder / "config.json").read_text())
        assert config["model_type"] == "adaflash_drafter" and (folder / "README.md").is_file()
        # size budgets that keep the repository easy to host: 20 MB for a 135M target's drafter, 100 MB for 1.5B
        budget_mb = {"smollm2-135m": 20, "qwen2.5-coder-1.5b": 100}.get(folder.name, 20)
        shards = list(
            folder.glob("*.safetensors")
        )  # one file, or shards with an index (each kept small for git hosting)
        assert sum(p.stat().st_size for p in shards) < budget_mb * 2**20, f"{folder.name} is over {budget_mb} MB"
        assert all(p.stat().st_size < 50 * 2**20 for p in shards), f"{folder.name}: shard a file over 50 MB"
        AdaFlashDrafter.from_pretrained(folder)


def test_loaded_drafter_recomputes_its_rope_buffer(drafter, tmp_path):
    """inv_freq is not saved: from_pretrained must rebuild it, or positions are garbage (a real bug once)."""
    drafter.save_pretrained(tmp_path)
    loaded = AdaFlashDrafter.from_pretrained(tmp_path)
    assert torch.equal(loaded.rotary_emb.inv_freq, drafter.rotary_emb.inv_freq)
    remote = AutoModel.from_pretrained(tmp_path, trust_remote_code=True)
    assert torch.equal(remote.rotary_emb.inv_freq, drafter.rotary_emb.inv_freq)
