"""Prepacked linear weights keep the model's outputs (bf16: bit for bit; fp32: to rounding, and the same tokens),
keep its parameters, and fall back where they must."""

from __future__ import annotations

import copy

import pytest
import torch

from adaflash_hf import generate
from adaflash_hf.decoding.draft_head import DraftHead
from adaflash_hf.kernels import (
    PackedLinear,
    is_packed,
    pack_linear_weights,
    packing_available,
    stock_linear,
    unpack_linear_weights,
)

from conftest import left_pad, random_prompts, tiny_target

BF16 = pytest.mark.skipif(
    not packing_available(torch.bfloat16), reason="this torch build or CPU has no oneDNN bf16 linear ops"
)
FP32 = pytest.mark.skipif(not packing_available(torch.float32), reason="this torch build has no oneDNN fp32 linear ops")
DTYPES = [pytest.param(torch.bfloat16, marks=BF16, id="bf16"), pytest.param(torch.float32, marks=FP32, id="fp32")]


def same_outputs(a: torch.Tensor, b: torch.Tensor) -> bool:
    """bf16: the same oneDNN kernel as stock, bit for bit; fp32: oneDNN instead of MKL, equal to rounding."""
    return torch.equal(a, b) if a.dtype == torch.bfloat16 else torch.allclose(a, b, rtol=1e-5, atol=1e-5)


def packed_pair(arch: str = "llama", dtype: torch.dtype = torch.bfloat16):
    stock = tiny_target(arch).to(dtype)
    packed = copy.deepcopy(stock)
    assert pack_linear_weights(packed, check_speed=False) == sum(
        isinstance(m, torch.nn.Linear) for m in stock.modules()
    )
    return stock, packed


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_packed_logits_match_stock(arch, dtype):
    stock, packed = packed_pair(arch, dtype)
    ids, mask = left_pad(random_prompts((3, 9, 6), seed=4))
    with torch.inference_mode():
        a, b = stock(ids, attention_mask=mask, use_cache=True), packed(ids, attention_mask=mask, use_cache=True)
        assert same_outputs(a.logits, b.logits)
        step = torch.tensor([[5, 6, 7]] * 3)  # a 3-token verification over the cache
        wide = torch.cat([mask, torch.ones_like(step)], dim=1)
        a2 = stock(step, attention_mask=wide, past_key_values=a.past_key_values, use_cache=True)
        b2 = packed(step, attention_mask=wide, past_key_values=b.past_key_values, use_cache=True)
        assert same_outputs(a2.logits, b2.logits)


@pytest.mark.parametrize("dtype", DTYPES)
def test_packed_target_generates_the_same_tokens(dtype):
    stock, packed = packed_pair(dtype=dtype)
    prompts = random_prompts((4, 8), seed=1)
    ids, mask = left_pad(prompts)
    expected = stock.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False)
    assert torch.equal(packed.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False), expected)
    out = generate(packed, None, ids, mask, max_new_tokens=10, do_sample=False)  # the engine over a packed target
    assert out.sequences.tolist() == expected.tolist()


@FP32
def test_speculation_over_a_packed_fp32_pair_equals_the_packed_targets_own_output():
    """What users run on a CPU without bf16 hardware: fp32 target and drafter, both packed, every draft source."""
    from adaflash_hf import AdaFlashDrafter

    _, target = packed_pair(dtype=torch.float32)
    torch.manual_seed(0)
    drafter = AdaFlashDrafter.from_target(target, num_layers=1, block_size=4).eval()
    assert pack_linear_weights(drafter, check_speed=False) > 0
    ids, mask = left_pad(random_prompts((5, 9, 7), seed=3))
    expected = target.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False)
    out = generate(target, drafter, ids, mask, max_new_tokens=16, do_sample=False)
    assert out.sequences.tolist() == expected.tolist()


@pytest.mark.parametrize("dtype", DTYPES)
def test_parameters_state_dict_and_ties_are_unchanged(dtype):
    stock, packed = packed_pair(dtype=dtype)
    assert stock.state_dict().keys() == packed.state_dict().keys()
    assert all(torch.equal(v, packed.state_dict()[k]) for k, v in stock.state_dict().items())
    assert [n for n, _ in stock.named_parameters()] == [n for n, _ in packed.named_parameters()]
    tied = tiny_target("llama").to(dtype)
    tied.config.tie_word_embeddings = True
    tied.tie_weights()
    pack_linear_weights(tied, check_speed=False)
    assert tied.lm_head.weight is tied.model.embed_tokens.weight


@BF16
def test_grad_mode_and_other_dtypes_fall_back_to_f_linear():
    layer = torch.nn.Linear(16, 8).to(torch.bfloat16)
    pack_linear_weights(layer, check_speed=False)
    assert isinstance(layer, PackedLinear)
    x = torch.randn(2, 3, 16, dtype=torch.bfloat16, requires_grad=True)
    layer(x).float().sum().backward()  # autograd: the stock path, gradients flow to input and weight
    assert x.grad is not None and layer.weight.grad is not None
    with torch.no_grad():  # an input of another dtype than the weight: the stock path
        assert torch.equal(layer(x.detach().float().to(torch.bfloat16)), layer(x.detach()))
    layer.half()  # a dtype oneDNN packing does not cover: the stock path
    x16 = x.detach().half()
    with torch.no_grad():
        assert torch.equal(layer(x16), torch.nn.functional.linear(x16, layer.weight, layer.bias))
    assert pack_linear_weights(torch.nn.Linear(4, 4).half(), check_speed=False) == 0  # fp16: nothing to pack


@FP32
def test_a_layer_moved_to_fp32_repacks_from_its_fp32_weight():
    layer = torch.nn.Linear(16, 8)
    assert pack_linear_weights(layer, check_speed=False) == 1
    x = torch.randn(2, 3, 16)
    with torch.no_grad():
        assert same_outputs(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))
        layer.double()  # fp64: the stock path
        assert torch.equal(layer(x.double()), torch.nn.functional.linear(x.double(), layer.weight, layer.bias))


@pytest.mark.parametrize("dtype", DTYPES)
def test_no_packing_where_the_copy_would_not_fit_in_memory(dtype, monkeypatch, caplog):
    import adaflash_hf.kernels as kernels

    model = tiny_target("llama").to(dtype)
    monkeypatch.setattr(kernels, "available_memory_bytes", lambda: 1000)
    assert pack_linear_weights(model, check_speed=False) == 0 and not is_packed(model)
    assert "would not fit in half of the available memory" in caplog.text
    monkeypatch.setattr(kernels, "available_memory_bytes", lambda: None)  # unknown: pack
    assert pack_linear_weights(model, check_speed=False) > 0


@BF16
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


@pytest.mark.parametrize("dtype", DTYPES)
def test_stock_linear_and_unpack(dtype):
    stock, packed = packed_pair(dtype=dtype)
    ids = torch.tensor([[5, 9, 11, 2]])
    with torch.inference_mode(), stock_linear(packed):
        assert not any(m.packed_enabled for m in packed.modules() if isinstance(m, PackedLinear))
        assert torch.equal(packed(ids).logits, stock(ids).logits)  # the stock kernels, bit for bit
    assert all(m.packed_enabled for m in packed.modules() if isinstance(m, PackedLinear))
    assert unpack_linear_weights(packed) > 0 and not is_packed(packed)
    assert all(type(m) is torch.nn.Linear for m in packed.modules() if isinstance(m, torch.nn.Linear))


@pytest.mark.parametrize("dtype", DTYPES)
def test_draft_head_packs_with_a_packed_lm_head(dtype):
    stock, packed = packed_pair(dtype=dtype)
    vocab = torch.tensor([3, 7, 11, 20])
    hidden = torch.randn(2, 5, stock.config.hidden_size, dtype=dtype)
    plain, fast = DraftHead(stock.lm_head, vocab), DraftHead(packed.lm_head, vocab)
    assert plain.packed is None and fast.packed is not None
    with torch.inference_mode():
        assert same_outputs(plain.logits(hidden[:, 1:]), fast.logits(hidden[:, 1:]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_full_vocabulary_draft_head_shares_the_lm_heads_packed_copy(dtype):
    _, packed = packed_pair(dtype=dtype)
    head = DraftHead(packed.lm_head, None)
    assert head.packed is packed.lm_head.packed  # no second copy of the whole lm_head


def test_a_non_module_gets_a_clear_error():
    with pytest.raises(TypeError, match="takes a torch.nn.Module"):
        pack_linear_weights("HuggingFaceTB/SmolLM2-135M-Instruct")


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_packed_model_deep_copies_and_the_copy_repacks(dtype):
    """AdaFlashOPD copies the serving drafter for its trainer: a packed (opaque oneDNN) weight must not break that."""
    stock, packed = packed_pair(dtype=dtype)
    ids = torch.tensor([[5, 9, 11, 2]])
    with torch.inference_mode():
        packed(ids)  # the packed copies exist now
    clone = copy.deepcopy(packed)
    assert is_packed(clone) and all(m.packed is None for m in clone.modules() if isinstance(m, PackedLinear))
    with torch.inference_mode():
        assert same_outputs(clone(ids).logits, stock(ids).logits)  # repacked on first use, same outputs
        assert all(m.packed is not None for m in clone.modules() if isinstance(m, PackedLinear))
    assert clone.model.layers[0].mlp.up_proj.weight.data_ptr() != packed.model.layers[0].mlp.up_proj.weight.data_ptr()
    float_copy = copy.deepcopy(packed).float()  # the OPD trainer's fp32 copy (F.linear under autograd)
    assert float_copy(ids).logits.dtype == torch.float32
