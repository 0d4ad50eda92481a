"""The drafter's architecture: sizing from a target, attention backends, cache equivalence."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from adaflash_hf import AdaFlashDrafter
from adaflash_hf.configuration_adaflash import default_target_layer_ids


def test_default_target_layer_ids_follow_dflash():
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert default_target_layer_ids(30, 1) == [15]
    assert default_target_layer_ids(4, 2) == [0, 3]


def test_from_target_sizes_everything(target):
    drafter = AdaFlashDrafter.from_target(target, num_layers=3, block_size=8, intermediate_size=40)
    text = target.config
    assert drafter.config.hidden_size == text.hidden_size and drafter.config.vocab_size == text.vocab_size
    assert drafter.config.num_hidden_layers == 3 and drafter.config.block_size == 8
    assert drafter.config.intermediate_size == 40
    assert drafter.config.rope_parameters["rope_theta"] == text.rope_parameters["rope_theta"]
    assert drafter.config.eos_token_id == text.eos_token_id
    assert drafter.fc.in_features == len(drafter.config.target_layer_ids) * text.hidden_size
    assert drafter.dtype == target.dtype


def inputs(drafter, batch=2, context=7, holes=True):
    g = torch.Generator().manual_seed(0)
    h = drafter.config.hidden_size
    q = drafter.config.block_size
    ctx = torch.randn(batch, context, len(drafter.config.target_layer_ids) * h, generator=g)
    noise = torch.randn(batch, q, h, generator=g)
    positions = torch.arange(context + q)[None].expand(batch, -1)
    mask = torch.ones(batch, context + q, dtype=torch.long)
    if holes:
        mask[0, :3] = 0  # left padding
        mask[1, 4] = 0  # a hole left by a rejected draft
    return noise, ctx, positions, mask


@pytest.mark.parametrize("holes", [False, True])
def test_eager_and_sdpa_agree(drafter, holes):
    noise, ctx, positions, mask = inputs(drafter, holes=holes)
    drafter.config._attn_implementation = "sdpa"
    sdpa = drafter(noise, ctx, position_ids=positions, attention_mask=mask).last_hidden_state
    drafter.config._attn_implementation = "eager"
    eager = drafter(noise, ctx, position_ids=positions, attention_mask=mask).last_hidden_state
    assert torch.allclose(sdpa, eager, atol=1e-5)


def test_masked_context_is_ignored(drafter):
    noise, ctx, positions, mask = inputs(drafter)
    base = drafter(noise, ctx, position_ids=positions, attention_mask=mask).last_hidden_state
    ctx = ctx.clone()
    ctx[1, 4] += 100.0  # change only the masked slot
    assert torch.allclose(
        base, drafter(noise, ctx, position_ids=positions, attention_mask=mask).last_hidden_state, atol=1e-5
    )


def test_incremental_context_cache_equals_full_context(drafter):
    """Feeding context in two rounds through a cache equals feeding it at once (the engine's pattern)."""
    noise, ctx, positions, mask = inputs(drafter, holes=False)
    q = drafter.config.block_size
    full = drafter(noise, ctx, position_ids=positions, attention_mask=mask).last_hidden_state
    cache = DynamicCache()
    first = torch.arange(4)[None].expand(2, -1)
    drafter(noise, ctx[:, :4], position_ids=torch.cat([first, first[:, -1:] + 1 + torch.arange(q)], 1), cache=cache)
    cache.crop(-q)
    rest = positions[:, 4:]
    out = drafter(noise, ctx[:, 4:], position_ids=rest, attention_mask=mask, cache=cache).last_hidden_state
    assert torch.allclose(out, full, atol=1e-5)
    assert cache.get_seq_length() == ctx.shape[1] + q


def test_position_ids_must_cover_context_and_block(drafter):
    noise, ctx, positions, _ = inputs(drafter)
    with pytest.raises(ValueError, match="position_ids covers"):
        drafter(noise, ctx, position_ids=positions[:, :-1])
