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
    deep = AdaFlashDrafter(AdaFlashDrafterConfig(**{**drafter.config.to_dict(), "target_layer_ids": [1, 9], "num_target_layers": None}))
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
        AdaFlashDrafterConfig(vocab_size=10, hidden_size=8, num_attention_heads=2, target_layer_ids=[7], num_target_layers=4)


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
