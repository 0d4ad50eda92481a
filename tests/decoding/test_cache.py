"""The engine's target cache (GrowingLayer): in-place updates, the same contents as transformers' DynamicCache."""

import pytest
import torch
from transformers import DynamicCache

from adaflash_hf._compat import CACHE_KWARG
from adaflash_hf.decoding.kv_cache import GrowingLayer, RaggedCache, relayout_cache


def random_states(generator, b=3, h=2, n=1, d=4):
    return torch.randn(b, h, n, d, generator=generator), torch.randn(b, h, n, d, generator=generator)


def test_growing_layer_holds_what_a_dynamic_cache_holds_through_updates_crops_and_reassignment():
    generator = torch.Generator().manual_seed(0)
    grown, stock = RaggedCache(), DynamicCache()
    for step in range(60):
        k, v = random_states(generator, n=1 + step % 5)
        for cache in (grown, stock):
            out_k, out_v = cache.update(k, v, 0)
        assert torch.equal(out_k, stock.layers[0].keys) and torch.equal(out_v, stock.layers[0].values)
        if step % 3 == 2:
            for cache in (grown, stock):
                cache.crop(-(step % 4))
        if step % 7 == 6:  # the engine re-lays the cache out (compaction, rows joining) by assigning new tensors
            index = torch.randperm(stock.layers[0].keys.shape[2], generator=generator)[:-1].sort().values
            for cache in (grown, stock):
                layer = cache.layers[0]
                layer.keys, layer.values = layer.keys[:, :, index], layer.values[:, :, index]
        assert grown.get_seq_length() == stock.get_seq_length()
        assert torch.equal(grown.layers[0].keys, stock.layers[0].keys)
        assert torch.equal(grown.layers[0].values, stock.layers[0].values)


def test_assigning_values_before_keys_keeps_each_length():
    generator = torch.Generator().manual_seed(1)
    layer = GrowingLayer()
    layer.update(*random_states(generator, n=10))
    old_values = layer.values.clone()
    layer.keys = layer.keys[:, :, :4]  # assigned one after the other, as relayout_cache does
    assert torch.equal(layer.values, old_values)
    layer.values = layer.values[:, :, 2:6]
    assert layer.keys.shape == layer.values.shape == (3, 2, 4, 4)


def test_one_token_updates_reallocate_rarely():
    """The point of the class: DynamicCache copies the whole layer at every update; this one only when it grows."""
    generator = torch.Generator().manual_seed(2)
    layer = GrowingLayer()
    layer.update(*random_states(generator, n=100))
    buffers = {layer._keys.data_ptr()}
    for _ in range(400):
        layer.update(*random_states(generator))
        buffers.add(layer._keys.data_ptr())
    assert layer.get_seq_length() == 500
    assert len(buffers) <= 8  # grows by a quarter (at least 64 slots): 100 -> 500 in a handful of steps


def test_crop_rejects_a_positive_count():
    layer = GrowingLayer()
    layer.update(*random_states(torch.Generator().manual_seed(3), n=4))
    with pytest.raises(ValueError, match="negative"):
        layer.crop(2)


def test_a_model_decodes_the_same_logits_with_either_cache(target):
    ids = torch.randint(0, target.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(4))
    outputs = []
    for cache in (DynamicCache(), RaggedCache()):
        with torch.inference_mode():
            logits = [target(input_ids=ids, use_cache=True, **{CACHE_KWARG: cache}).logits[:, -1:]]
            for _ in range(6):
                logits.append(target(input_ids=logits[-1].argmax(-1), use_cache=True, **{CACHE_KWARG: cache}).logits)
            cache.crop(-3)
            logits.append(target(input_ids=ids[:, :2], use_cache=True, **{CACHE_KWARG: cache}).logits)
        outputs.append(torch.cat(logits, 1))
    assert torch.equal(outputs[0], outputs[1])


def test_relayout_moves_every_slot_of_a_grown_cache_and_later_updates_append_after_it():
    """relayout_cache reads a GrowingLayer's buffer in place (spare room included in its strides): it must equal a
    plain gather, zero the holes, and leave the layer's length at the new width."""
    generator = torch.Generator().manual_seed(5)
    cache = RaggedCache()
    for n in (7, 1, 1, 3):  # a prompt, then decode steps: the buffers have spare room
        cache.update(*random_states(generator, n=n), 0)
        cache.update(*random_states(generator, n=n), 1)
    old = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
    slots = old[0][0].shape[2]
    index = torch.stack([torch.randint(-1, slots, (slots + 2,), generator=generator) for _ in range(3)])
    relayout_cache(cache, index)
    for layer, (keys, values) in zip(cache.layers, old):
        for new, before in ((layer.keys, keys), (layer.values, values)):
            expected = before.gather(2, index.clamp_min(0)[:, None, :, None].expand(3, 2, slots + 2, 4))
            expected = expected.masked_fill((index < 0)[:, None, :, None], 0)
            assert torch.equal(new, expected)
        assert layer.get_seq_length() == slots + 2
    relaid = cache.layers[0].keys.clone()
    k, v = random_states(generator, n=2)
    out_k, out_v = cache.update(k, v, 0)
    assert out_k.shape[2] == slots + 4 and torch.equal(out_k[:, :, -2:], k) and torch.equal(out_v[:, :, -2:], v)
    assert torch.equal(out_k[:, :, : slots + 2], relaid)
