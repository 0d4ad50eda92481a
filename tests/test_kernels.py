"""Prepacked bf16 linear weights change no output, keep the model's parameters, and fall back where they must."""

from __future__ import annotations

import copy

import pytest
import torch

from adaflash_hf import generate
from adaflash_hf.decoding.proposers import DraftHead
from adaflash_hf.kernels import (
    PackedLinear,
    is_packed,
    pack_linear_weights,
    packing_available,
    stock_linear,
    unpack_linear_weights,
)

from conftest import left_pad, random_prompts, tiny_target

pytestmark = pytest.mark.skipif(not packing_available(), reason="this torch build or CPU has no oneDNN bf16 linear ops")


def bf16_pair(arch: str = "llama"):
    stock = tiny_target(arch).to(torch.bfloat16)
    packed = copy.deepcopy(stock)
    assert pack_linear_weights(packed, check_speed=False) == sum(isinstance(m, torch.nn.Linear) for m in stock.modules())
    return stock, packed


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_packed_logits_are_bit_identical(arch):
    stock, packed = bf16_pair(arch)
    ids, mask = left_pad(random_prompts((3, 9, 6), seed=4))
    with torch.inference_mode():
        a, b = stock(ids, attention_mask=mask, use_cache=True), packed(ids, attention_mask=mask, use_cache=True)
        assert torch.equal(a.logits, b.logits)
        step = torch.tensor([[5, 6, 7]] * 3)  # a 3-token verification over the cache
        wide = torch.cat([mask, torch.ones_like(step)], dim=1)
        a2 = stock(step, attention_mask=wide, past_key_values=a.past_key_values, use_cache=True)
        b2 = packed(step, attention_mask=wide, past_key_values=b.past_key_values, use_cache=True)
        assert torch.equal(a2.logits, b2.logits)


def test_packed_target_generates_the_same_tokens():
    stock, packed = bf16_pair()
    prompts = random_prompts((4, 8), seed=1)
    ids, mask = left_pad(prompts)
    expected = stock.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False)
    assert torch.equal(packed.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False), expected)
    out = generate(packed, None, ids, mask, max_new_tokens=10, do_sample=False)  # the engine over a packed target
    assert out.sequences.tolist() == expected.tolist()


def test_parameters_state_dict_and_ties_are_unchanged():
    stock, packed = bf16_pair()
    assert stock.state_dict().keys() == packed.state_dict().keys()
    assert all(torch.equal(v, packed.state_dict()[k]) for k, v in stock.state_dict().items())
    assert [n for n, _ in stock.named_parameters()] == [n for n, _ in packed.named_parameters()]
    tied = tiny_target("llama").to(torch.bfloat16)
    tied.config.tie_word_embeddings = True
    tied.tie_weights()
    pack_linear_weights(tied, check_speed=False)
    assert tied.lm_head.weight is tied.model.embed_tokens.weight


def test_grad_mode_and_other_dtypes_fall_back_to_f_linear():
    layer = torch.nn.Linear(16, 8).to(torch.bfloat16)
    pack_linear_weights(layer, check_speed=False)
    assert isinstance(layer, PackedLinear)
    x = torch.randn(2, 3, 16, dtype=torch.bfloat16, requires_grad=True)
    layer(x).float().sum().backward()  # autograd: the stock path, gradients flow to input and weight
    assert x.grad is not None and layer.weight.grad is not None
    layer.float()  # a layer moved to fp32 is not packed any more
    assert torch.equal(layer(x.detach().float()), torch.nn.functional.linear(x.detach().float(), layer.weight, layer.bias))
    assert pack_linear_weights(torch.nn.Linear(4, 4), check_speed=False) == 0  # fp32: nothing to pack


def test_in_place_weight_change_repacks():
    layer = torch.nn.Linear(16, 8, bias=False).to(torch.bfloat16)
    pack_linear_weights(layer, check_speed=False)
    x = torch.randn(1, 4, 16, dtype=torch.bfloat16)
    with torch.no_grad():
        before = layer(x)
        layer.weight.mul_(2)  # bumps the version counter
        after = layer(x)
    assert torch.equal(after, torch.nn.functional.linear(x, layer.weight))
    assert not torch.equal(before, after)


def test_stock_linear_and_unpack():
    stock, packed = bf16_pair()
    ids = torch.tensor([[5, 9, 11, 2]])
    with torch.inference_mode(), stock_linear(packed):
        assert not any(m.packed_enabled for m in packed.modules() if isinstance(m, PackedLinear))
        assert torch.equal(packed(ids).logits, stock(ids).logits)
    assert all(m.packed_enabled for m in packed.modules() if isinstance(m, PackedLinear))
    assert unpack_linear_weights(packed) > 0 and not is_packed(packed)
    assert all(type(m) is torch.nn.Linear for m in packed.modules() if isinstance(m, torch.nn.Linear))


def test_draft_head_packs_with_a_packed_lm_head():
    stock, packed = bf16_pair()
    vocab = torch.tensor([3, 7, 11, 20])
    hidden = torch.randn(2, 5, stock.config.hidden_size, dtype=torch.bfloat16)
    plain, fast = DraftHead(stock.lm_head, vocab), DraftHead(packed.lm_head, vocab)
    assert plain.packed is None and fast.packed is not None
    with torch.inference_mode():
        assert torch.equal(plain.logits(hidden[:, 1:]), fast.logits(hidden[:, 1:]))


def test_full_vocabulary_draft_head_shares_the_lm_heads_packed_copy():
    _, packed = bf16_pair()
    head = DraftHead(packed.lm_head, None)
    assert head.packed is packed.lm_head.packed  # no second copy of the whole lm_head


def test_a_non_module_gets_a_clear_error():
    with pytest.raises(TypeError, match="takes a torch.nn.Module"):
        pack_linear_weights("HuggingFaceTB/SmolLM2-135M-Instruct")


def test_a_packed_model_deep_copies_and_the_copy_repacks():
    """AdaFlashOPD copies the serving drafter for its trainer: a packed (opaque oneDNN) weight must not break that."""
    stock, packed = bf16_pair()
    ids = torch.tensor([[5, 9, 11, 2]])
    with torch.inference_mode():
        packed(ids)  # the packed copies exist now
    clone = copy.deepcopy(packed)
    assert is_packed(clone) and all(m.packed is None for m in clone.modules() if isinstance(m, PackedLinear))
    with torch.inference_mode():
        assert torch.equal(clone(ids).logits, stock(ids).logits)  # repacked on first use, same outputs
        assert all(m.packed is not None for m in clone.modules() if isinstance(m, PackedLinear))
    assert clone.model.layers[0].mlp.up_proj.weight.data_ptr() != packed.model.layers[0].mlp.up_proj.weight.data_ptr()
    float_copy = copy.deepcopy(packed).float()  # the OPD trainer's fp32 copy falls back to F.linear
    assert float_copy(ids).logits.dtype == torch.float32
