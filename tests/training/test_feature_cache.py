"""Cached target features equal a live target forward, resume and refuse mismatches; target-initialised
draft layers are copies of the target's, with a context projection that passes the deepest layer through."""

from __future__ import annotations

import json

import pytest
import torch
from test_training import TINY_EVAL, TINY_RUN  # the test folder is on sys.path under pytest
from transformers import LlamaConfig, LlamaForCausalLM

from adaflash_hf.modeling_adaflash import AdaFlashDrafter
from adaflash_hf.training.data import _write_shard, collate, target_features
from adaflash_hf.training.features import FeatureStore, build_feature_cache
from adaflash_hf.training.init import copied_layer_ids, init_from_target
from adaflash_hf.training.losses import position_weights
from adaflash_hf.training.step import drafter_block_forward

LAYERS = [0, 2]


class _Tokenizer:
    pad_token_id = 2
    eos_token_id = 2


def tiny_target(layers: int = 5) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    return LlamaForCausalLM(config).eval()


def write_responses(data_dir, shards: int = 2, per_shard: int = 3) -> None:
    generator = torch.Generator().manual_seed(0)
    folder = data_dir / "train" / "0123456789abcdef"
    folder.mkdir(parents=True)
    for shard in range(shards):
        records = []
        for _ in range(per_shard):
            n = int(torch.randint(12, 30, (), generator=generator))
            records.append(
                (
                    torch.randint(4, 64, (n,), generator=generator).tolist(),
                    int(torch.randint(2, 8, (), generator=generator)),
                )
            )
        _write_shard(folder / f"shard_{shard:05d}.safetensors", records)


# a tiny run from a feature cache (with test_training.chat_target)
CACHED_RUN = {**TINY_RUN, "seq_len": 512, **TINY_EVAL}


def count_target_forwards(monkeypatch, trainer_module) -> list:
    """Patch the trainer's live target forward to count its calls; returns the list it appends to."""
    calls = []
    real = trainer_module.target_features
    monkeypatch.setattr(trainer_module, "target_features", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def write_chat_responses(data_dir, vocab: int):
    """One shard of four 40-token responses (prompt of 6) over the chat target's vocabulary; returns data_dir."""
    folder = data_dir / "train" / "0123456789abcdef"
    folder.mkdir(parents=True)
    generator = torch.Generator().manual_seed(0)
    _write_shard(
        folder / "shard_00000.safetensors",
        [(torch.randint(4, vocab, (40,), generator=generator).tolist(), 6) for _ in range(4)],
    )
    return data_dir


def test_cached_features_equal_a_live_target_forward(tmp_path):
    target = tiny_target()
    write_responses(tmp_path / "data")
    cache = build_feature_cache(target, _Tokenizer(), tmp_path / "data", tmp_path / "cache", LAYERS, "tiny")
    store = FeatureStore(cache)
    assert len(store) == 6 and store.layer_ids == LAYERS
    batch, cached = store.batch([0, 4, 5], pad_token_id=2)
    live = target_features(target, batch, LAYERS)
    rows = batch.attention_mask.bool()
    assert torch.equal(cached.labels[rows], live.labels[rows])  # the target's argmax, position by position
    assert torch.equal(cached.context[rows], live.context[rows].to(torch.bfloat16))  # bf16 of the same states
    same = collate([store.training_sequence(i) for i in (0, 4, 5)], pad_token_id=2)
    assert torch.equal(same.input_ids, batch.input_ids) and torch.equal(same.label_mask, batch.label_mask)

    # One training step's loss from cached features matches the live one up to the bf16 rounding of the context.
    torch.manual_seed(1)
    drafter = AdaFlashDrafter.from_target(target, num_layers=1, block_size=4, target_layer_ids=LAYERS, mask_token_id=3)
    anchors = torch.tensor([[3, 8], [9, 10], [2, 12]])
    valid = torch.ones_like(anchors, dtype=torch.bool)
    weights = position_weights(4, 4.0)
    cached.context = cached.context.float()
    losses = [
        drafter_block_forward(drafter, target, batch, f, anchors, valid, weights, True).loss for f in (cached, live)
    ]
    assert torch.allclose(losses[0].float(), losses[1].float(), rtol=2e-2)


def test_feature_cache_resumes_and_refuses_mismatches(tmp_path):
    target = tiny_target()
    write_responses(tmp_path / "data", shards=3)
    cache = build_feature_cache(
        target, _Tokenizer(), tmp_path / "data", tmp_path / "cache", LAYERS, "tiny", max_minutes=1e-9
    )  # stops after the first shard
    assert sorted(json.loads((cache / "meta.json").read_text())["shards"]) == ["shard_00000"]
    first = (cache / "shard_00000" / "context.npy").stat().st_mtime_ns
    build_feature_cache(target, _Tokenizer(), tmp_path / "data", cache, LAYERS, "tiny")
    assert len(FeatureStore(cache)) == 9
    first_shard = FeatureStore(cache, max_shards=1)  # the data a run saw when only the first shard was finished
    assert len(first_shard) == 3
    assert torch.equal(first_shard.batch([0, 2], 2)[0].input_ids, FeatureStore(cache).batch([0, 2], 2)[0].input_ids)
    assert (cache / "shard_00000" / "context.npy").stat().st_mtime_ns == first  # finished shards are kept
    with pytest.raises(ValueError, match="another configuration"):
        build_feature_cache(target, _Tokenizer(), tmp_path / "data", cache, [1, 2], "tiny")
    with pytest.raises(ValueError, match="target layers"):
        FeatureStore(cache).check("tiny", [1, 2])
    with pytest.raises(FileNotFoundError, match="cache-features"):
        FeatureStore(tmp_path / "nothing")


def test_an_added_answer_set_extends_the_cache_without_renaming_it(tmp_path):
    target = tiny_target()
    write_responses(tmp_path / "data", shards=2)
    cache = build_feature_cache(target, _Tokenizer(), tmp_path / "data", tmp_path / "cache", LAYERS, "tiny")
    before = json.loads((cache / "meta.json").read_text())["shards"]
    # a second answer set (say, sampled answers) whose folder sorts before the first one
    (tmp_path / "data" / "train" / "0123456789abcdef").rename(tmp_path / "first")
    write_responses(tmp_path / "data", shards=1)
    (tmp_path / "data" / "train" / "0123456789abcdef").rename(tmp_path / "data" / "train" / "0000000000000000")
    (tmp_path / "first").rename(tmp_path / "data" / "train" / "0123456789abcdef")
    build_feature_cache(target, _Tokenizer(), tmp_path / "data", cache, LAYERS, "tiny")
    after = json.loads((cache / "meta.json").read_text())["shards"]
    assert {name: after[name]["source"] for name in before} == {name: e["source"] for name, e in before.items()}
    assert after["shard_00002"]["source"] == "train/0000000000000000/shard_00000.safetensors"
    assert len(FeatureStore(cache)) == 9


def test_target_initialised_layers_copy_the_target_and_pass_the_deepest_context_through():
    target = tiny_target(layers=5)
    drafter = AdaFlashDrafter.from_target(target, num_layers=2, block_size=4, target_layer_ids=LAYERS, mask_token_id=3)
    assert copied_layer_ids(5, LAYERS, 2) == [3, 4] and copied_layer_ids(5, [0, 4], 2) == [3, 4]
    ids = torch.randint(4, 64, (2, 16))
    copied = init_from_target(drafter, target, ids, torch.ones_like(ids))
    assert copied == [3, 4]
    for draft_layer, j in zip(drafter.layers, copied):
        source = dict(target.model.layers[j].named_parameters())
        for name, param in draft_layer.named_parameters():
            if "q_norm" in name or "k_norm" in name:
                assert (param > 0).all() and torch.equal(param, param[0].expand_as(param))  # one calibrated scale
            else:
                assert torch.equal(param, source[name]), name
    with torch.no_grad():
        hidden = target(ids, output_hidden_states=True).hidden_states
        context = torch.cat([hidden[i + 1] for i in LAYERS], dim=-1)
        expected = target.model.layers[3].input_layernorm(hidden[3])  # layer 2's output, as layer 3 normalises it
        assert torch.allclose(drafter.project_context(context), expected, atol=1e-5)


def test_training_from_the_cache_runs_no_target_forward_for_its_batches(tmp_path, monkeypatch):
    from test_training import chat_target

    import adaflash_hf.training.trainer as trainer_module
    from adaflash_hf.training import TrainDrafterConfig, train_drafter

    target, tokenizer = chat_target(layers=4)
    data_dir = write_chat_responses(tmp_path / "data", len(tokenizer))
    cache = build_feature_cache(target, tokenizer, data_dir, tmp_path / "cache", [1, 3], "tiny")
    calls = count_target_forwards(monkeypatch, trainer_module)
    common = dict(**CACHED_RUN, corpus_fraction=0.0, max_steps=4, data_dir=str(data_dir), feature_cache=str(cache))
    final = train_drafter(TrainDrafterConfig(output_dir=str(tmp_path / "run"), **common), target, tokenizer)
    assert calls == [1]  # the final held-out evaluation only: every training batch came from the cache
    summary = json.loads((final / "training_summary.json").read_text())
    assert summary["steps"] == 4 and summary["target_layer_ids"] == [1, 3]
    assert summary["feature_cache"]["tokens"] == 160
    with pytest.raises(ValueError, match="target layers"):
        train_drafter(
            TrainDrafterConfig(output_dir=str(tmp_path / "other"), target_layer_ids=[0, 2], **common), target, tokenizer
        )
    with pytest.raises(ValueError, match="distill_weight"):
        TrainDrafterConfig(output_dir="x", feature_cache=str(cache), distill_weight=0.5)
    with pytest.raises(FileNotFoundError, match="cache-features"):  # before any model loads
        TrainDrafterConfig(output_dir="x", feature_cache=str(tmp_path / "nothing"))

    target_init = train_drafter(
        TrainDrafterConfig(
            output_dir=str(tmp_path / "init"), num_layers=1, init_layers="target", **{**common, "max_steps": 1}
        ),
        target,
        tokenizer,
    )
    summary = json.loads((target_init / "training_summary.json").read_text())
    assert summary["held_out_at_init"]["tau"] >= 1.0  # the starting point is measured


def test_corpus_windows_are_cached_beside_the_responses_and_train_without_a_target_forward(tmp_path, monkeypatch):
    from datasets import Dataset
    from test_training import chat_target

    import adaflash_hf.data as data_module
    import adaflash_hf.training.features as features_module
    import adaflash_hf.training.trainer as trainer_module
    from adaflash_hf.training import TrainDrafterConfig, train_drafter
    from adaflash_hf.training.data import pack_corpus

    target, tokenizer = chat_target(layers=4)
    texts = [f"passage {i}: the cat sat on the mat and counted {i * 7} apples." for i in range(40)]
    monkeypatch.setattr(data_module, "load_text_corpus", lambda *a, **k: Dataset.from_dict({"text": list(texts)}))
    monkeypatch.setattr(features_module, "CORPUS_WINDOWS_PER_SHARD", 8)
    data_dir = write_chat_responses(tmp_path / "data", len(tokenizer))
    cache = build_feature_cache(
        target, tokenizer, data_dir, tmp_path / "cache", [1, 3], "tiny", corpus_domains=["math"], seq_len=32
    )
    windows = pack_corpus(tokenizer, texts, 32)
    store = FeatureStore(cache)
    corpus = store.indices("corpus")
    assert len(store.indices("response")) == 4 and len(corpus) == len(windows) > 8  # more than one corpus shard
    assert store.num_response_tokens == 4 * 34 and store.tokens_of("corpus") == 32 * len(windows)
    shards = json.loads((cache / "meta.json").read_text())["shards"]
    assert shards["corpus_00000"]["kind"] == "corpus" and shards["corpus_00000"]["domains"] == ["math"]
    picked = [corpus[0], corpus[-1]]
    batch, cached = store.batch(picked, pad_token_id=2)
    assert torch.equal(batch.input_ids, torch.stack([windows[0].input_ids, windows[-1].input_ids]))
    live = target_features(target, batch, [1, 3])
    assert torch.equal(cached.labels[:, 1:], live.labels[:, 1:])  # the target's argmax on teacher-forced text
    assert torch.equal(cached.context, live.context.to(torch.bfloat16))

    first = (cache / "corpus_00000" / "context.npy").stat().st_mtime_ns
    build_feature_cache(target, tokenizer, data_dir, cache, [1, 3], "tiny", corpus_domains=["math"], seq_len=32)
    assert (cache / "corpus_00000" / "context.npy").stat().st_mtime_ns == first  # resumed: nothing recomputed
    texts[0] = "another first passage, so the first window changes."
    with pytest.raises(ValueError, match="another version of corpus math"):
        build_feature_cache(target, tokenizer, data_dir, cache, [1, 3], "tiny", corpus_domains=["math"], seq_len=32)

    calls = count_target_forwards(monkeypatch, trainer_module)
    config = TrainDrafterConfig(
        output_dir=str(tmp_path / "run"),
        **{**CACHED_RUN, "seq_len": 32},
        corpus_fraction=0.5,
        max_steps=6,
        data_dir=str(data_dir),
        feature_cache=str(cache),
    )
    final = train_drafter(config, target, tokenizer)
    assert calls == [1]  # the final held-out evaluation only: corpus and response batches both came from the cache
    summary = json.loads((final / "training_summary.json").read_text())
    assert summary["data_sizes"]["corpus_sequences"] == len(windows)
    assert summary["feature_cache"]["corpus_tokens"] == 32 * len(windows)


def test_cache_features_config_says_what_is_missing(tmp_path):
    from adaflash_hf.training.data_configs import CacheFeaturesConfig

    with pytest.raises(ValueError, match="nothing to cache"):
        CacheFeaturesConfig()
    with pytest.raises(ValueError, match="unknown domain"):
        CacheFeaturesConfig(corpus=["poetry"])
    assert CacheFeaturesConfig(corpus=["code", "math"]).data_dir is None
