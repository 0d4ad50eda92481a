"""Ragged verification: rows of different verify lengths packed into one forward attend exactly as padded rows do."""

from __future__ import annotations

import contextlib

import pytest
import torch

from adaflash_hf import DraftingConfig, DraftingState, GoodputVerifyLength, generate
from adaflash_hf import _compat as compat
from adaflash_hf._compat import (
    CACHE_KWARG,
    RaggedLayout,
    fold_gqa,
    folded_sdpa,
    folds,
    ragged_forward,
    supports_ragged,
)
from adaflash_hf.decoding import membership
from adaflash_hf.decoding import state as state_module
from adaflash_hf.decoding.cost import VerifyCostModel
from adaflash_hf.decoding.draft_tree import tree_attention_mask
from adaflash_hf.decoding.goodput import MIN_GAIN, ragged_verify_lens
from adaflash_hf.decoding.kv_cache import RaggedCache
from adaflash_hf.decoding.state import SpeculativeBatch

from conftest import EOS, OracleDrafter, greedy_reference, left_pad, random_prompts


def test_layout_packs_real_tokens_row_major_and_pads_with_each_rows_last_token():
    layout = RaggedLayout.from_lengths(torch.tensor([1, 3, 2]), width=3)
    x = torch.arange(9).view(3, 3)
    packed = layout.pack(x)
    assert packed.tolist() == [[0, 3, 4, 5, 6, 7]]
    assert layout.unpack(packed).tolist() == [[0, 0, 0], [3, 4, 5], [6, 7, 7]]
    heads = torch.randn(1, 2, 6, 4)  # (1, h, T, d)
    assert torch.equal(layout.unpack_heads(heads)[1, :, 2], heads[0, :, 3])  # row 1, column 2 = packed token 3


@pytest.mark.parametrize(
    "lengths", [[1, 4, 3], [1, 4, 1], [1, 1, 1]]
)  # padded attention; anchors + long rows; anchors only
@pytest.mark.parametrize("tree", [False, True])
def test_ragged_forward_matches_the_padded_forward(target, tree, lengths):
    assert supports_ragged(target)
    ids, mask = left_pad(random_prompts((4, 9, 6), seed=3))
    b = ids.shape[0]
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    caches = []
    with torch.inference_mode():
        for _ in range(2):
            cache = RaggedCache()
            target(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **{CACHE_KWARG: cache})
            caches.append(cache)
        g = 3
        verify_ids = torch.randint(4, 40, (b, g + 1))
        parents = torch.tensor([[0, 0, 1], [0, 1, 2], [0, 1, 1]]) if tree else torch.arange(g)[None].expand(b, -1)
        depths = torch.tensor([[1, 1, 2], [1, 2, 3], [1, 2, 2]]) if tree else torch.arange(1, g + 1)[None].expand(b, -1)
        verify_pos = pos[:, -1:] + 1 + torch.cat([torch.zeros(b, 1, dtype=torch.long), depths], dim=1)
        attn = tree_attention_mask(mask, parents, target.dtype)
        padded = target(
            input_ids=verify_ids,
            position_ids=verify_pos,
            attention_mask=attn,
            use_cache=True,
            **{CACHE_KWARG: caches[0]},
        ).logits
        lengths = torch.tensor(lengths)
        layout = RaggedLayout.from_lengths(lengths, g + 1)
        with ragged_forward(layout):
            out = target(
                input_ids=layout.pack(verify_ids),
                position_ids=layout.pack(verify_pos),
                attention_mask=attn,
                use_cache=True,
                **{CACHE_KWARG: caches[1]},
            )
        ragged = layout.unpack(out.logits)
    for row, n in enumerate(lengths.tolist()):
        torch.testing.assert_close(ragged[row, :n], padded[row, :n], atol=1e-5, rtol=1e-5)
        for a, b_ in zip(caches[0].layers, caches[1].layers):  # the real slots hold the same keys and values
            width = a.keys.shape[2] - (g + 1) + n
            torch.testing.assert_close(a.keys[row, :, :width], b_.keys[row, :, :width], atol=1e-5, rtol=1e-5)
    with torch.inference_mode():  # outside the block the model is plain transformers again
        torch.testing.assert_close(target(ids, attention_mask=mask).logits, target(ids, attention_mask=mask).logits)


class GroupedAttention(torch.nn.Module):
    """Stands in for a transformers attention module: grouped-query, causal unless told otherwise."""

    def __init__(self, groups: int, is_causal: bool = True):
        super().__init__()
        self.num_key_value_groups, self.is_causal = groups, is_causal


def repeated_attention(query, key, value, mask):
    """The reference: every query head over its own copy of its key/value head (as ``repeat_kv``), (b, q, H, d)."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask).transpose(1, 2)


@pytest.mark.parametrize("mask_kind", ["bool", "additive", "none"])
@pytest.mark.parametrize("b,q", [(1, 1), (5, 1), (4, 3), (6, 8)])
def test_folded_attention_equals_attention_over_repeated_keys(b, q, mask_kind):
    gen = torch.Generator().manual_seed(b * 10 + q)
    heads, kv_heads, s, d = 6, 2, 11, 8
    query, key, value = (torch.randn(b, n, t, d, generator=gen) for n, t in ((heads, q), (kv_heads, s), (kv_heads, s)))
    visible = torch.rand(b, 1, q, s, generator=gen) > 0.3
    visible[..., -1] = True  # every query sees at least one key
    mask = {
        "bool": visible,
        "additive": torch.zeros(visible.shape).masked_fill(~visible, torch.finfo(torch.float32).min),
        "none": None,
    }[mask_kind]
    module = GroupedAttention(heads // kv_heads, is_causal=q == 1)
    assert folds(module, query, mask) == (q == 1 or b >= 4)
    out, weights = folded_sdpa(module, query, key, value, mask)
    assert weights is None and out.shape == (b, q, heads, d) and out.is_contiguous()
    torch.testing.assert_close(out, repeated_attention(query, key, value, mask), atol=1e-6, rtol=1e-5)


def test_folding_is_declined_where_it_does_not_apply():
    query = torch.zeros(8, 4, 3, 2)
    mask = torch.ones(8, 1, 3, 5, dtype=torch.bool)
    assert folds(GroupedAttention(2), query, mask)
    assert not folds(GroupedAttention(1), query, mask)  # no grouping: nothing to fold
    assert not folds(GroupedAttention(2), query, None)  # causal without a mask: stock SDPA's is_causal
    assert folds(GroupedAttention(2, is_causal=False), query, None)  # a bidirectional block (the drafter's)
    assert not folds(GroupedAttention(2), query, mask, dropout=0.1)
    assert not folds(GroupedAttention(2), query, mask, softcap=30.0)
    assert not folds(GroupedAttention(2), query, torch.ones(8, 4, 3, 5, dtype=torch.bool))  # per-head masks
    assert not folds(GroupedAttention(2), torch.zeros(2, 4, 3, 2), mask[:2])  # few rows of several tokens
    assert not folds(
        GroupedAttention(2), torch.zeros(8, 4, 200, 2), torch.ones(8, 1, 200, 5, dtype=torch.bool)
    )  # a prefill


def test_the_target_under_folded_attention_gives_the_logits_of_stock_attention(target, monkeypatch):
    calls = []
    real = compat.folded_sdpa
    monkeypatch.setattr(compat, "folded_sdpa", lambda *args, **kwargs: calls.append(1) or real(*args, **kwargs))
    ids, mask = left_pad(random_prompts((4, 9, 6, 7, 5), seed=4))
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    logits = []
    with torch.inference_mode():
        for folded in (False, True):
            cache = RaggedCache()
            target(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **{CACHE_KWARG: cache})
            steps = []
            for k in (1, 3):  # a decode step (one query per row), then a verify of three
                new = torch.randint(4, 40, (ids.shape[0], k), generator=torch.Generator().manual_seed(k))
                step_pos = pos[:, -1:] + 1 + torch.arange(k)
                full = torch.cat([mask, torch.ones(ids.shape[0], k, dtype=mask.dtype)], dim=1)
                with fold_gqa(torch.device("cpu")) if folded else contextlib.nullcontext():
                    out = target(
                        input_ids=new,
                        position_ids=step_pos,
                        attention_mask=full,
                        use_cache=True,
                        **{CACHE_KWARG: cache},
                    )
                cache.crop(-k)
                steps.append(out.logits)
            logits.append(steps)
    assert len(calls) == 2 * target.config.num_hidden_layers  # every layer of both forwards ran folded
    for stock, folded in zip(*logits):
        torch.testing.assert_close(folded, stock, atol=1e-5, rtol=1e-5)


class CyclingVerifyLength:
    """A test policy: every row verifies a different length, changing from round to round."""

    def __init__(self):
        self.round = 0

    def verify_lens(self, rates, draft_hidden_states, sources=None):
        self.round += 1
        b, m = rates.shape
        return torch.tensor([1 + (i + self.round) % (m + 1) for i in range(b)])

    def update(self, accept_lengths, verify_lens, seconds):
        pass


class RaggedCalls(list):
    """Packed token counts of ragged verification forwards; ``prefills``: those of ragged prefills."""

    def __init__(self):
        super().__init__()
        self.prefills: list[int] = []


@pytest.fixture
def ragged_calls(monkeypatch):
    """The packed token counts of the engine's ragged forwards (verifications; prefills apart)."""
    used, real, prefill = RaggedCalls(), state_module.ragged_forward, SpeculativeBatch._prefill
    prefilling = []

    def counting(layout):
        (used.prefills if prefilling else used).append(layout.num_tokens)
        return real(layout)

    def marked_prefill(self, prompts):
        prefilling.append(True)
        try:
            return prefill(self, prompts)
        finally:
            prefilling.pop()

    for module in (state_module, membership):  # verifications and prefills
        monkeypatch.setattr(module, "ragged_forward", counting)
    monkeypatch.setattr(SpeculativeBatch, "_prefill", marked_prefill)
    return used


def test_prompts_of_different_lengths_prefill_packed_as_the_padded_prefill_would(target, drafter, ragged_calls):
    prompts = random_prompts((3, 9, 5, 12), seed=5)
    results = []
    for ragged in (False, True):
        batch = SpeculativeBatch(target, drafter, drafting_state=DraftingState())
        batch.ragged = ragged
        with torch.inference_mode():
            results.append(batch._prefill(prompts))
    assert ragged_calls.prefills == [sum(map(len, prompts))]  # only the second ran packed, every real token once
    (cache, mask, positions, logits, features), (cache_r, mask_r, positions_r, logits_r, features_r) = results
    assert torch.equal(mask, mask_r) and torch.equal(positions, positions_r)
    torch.testing.assert_close(logits_r, logits)
    valid = mask.bool()  # left padding: holes in either cache, zeros in the packed run's features
    torch.testing.assert_close(features_r[valid], features[valid])
    assert not features_r[~valid].any()
    for layer, layer_r in zip(cache.layers, cache_r.layers):
        for name in ("keys", "values"):
            padded, packed = (getattr(x, name).transpose(1, 2) for x in (layer, layer_r))  # (b, S, heads, d)
            assert packed.shape == padded.shape
            torch.testing.assert_close(packed[valid], padded[valid])


def test_engine_verifies_ragged_rows_and_stays_lossless(target, drafter, ragged_calls):
    prompts = random_prompts((3, 9, 5, 12, 7), seed=2)
    ids, mask = left_pad(prompts)
    width = ids.shape[1]
    references = {width - len(p): greedy_reference(target, p, 40, eos=False) for p in prompts}
    oracle = OracleDrafter(drafter.config).setup(target, references, 0.2).eval()
    out = generate(
        target,
        oracle,
        ids,
        mask,
        max_new_tokens=24,
        eos_token_id=EOS,
        drafting=DraftingConfig.only("drafter"),
        drafting_state=DraftingState(),
        verify_policy=CyclingVerifyLength(),
    )
    rows = [row[width : width + n] for row, n in zip(out.sequences.tolist(), out.num_new_tokens)]
    assert rows == [greedy_reference(target, p, 24)[len(p) :] for p in prompts]
    assert ragged_calls, "rows of different verify lengths should have been verified ragged"


def test_goodput_policy_goes_ragged_and_stays_lossless(target, drafter, ragged_calls):
    prompts = random_prompts((4, 7, 10, 5), seed=8)
    ids, mask = left_pad(prompts)
    policy = GoodputVerifyLength()
    out = generate(
        target,
        drafter,
        ids,
        mask,
        max_new_tokens=16,
        eos_token_id=None,
        verify_policy=policy,
        drafting=DraftingConfig(),
        drafting_state=DraftingState(),
    )
    assert policy.ragged and ragged_calls
    rows = [row[ids.shape[1] : ids.shape[1] + n] for row, n in zip(out.sequences.tolist(), out.num_new_tokens)]
    assert rows == [greedy_reference(target, p, 16, eos=False)[len(p) :] for p in prompts]


def test_ragged_lengths_take_the_likeliest_drafts_as_row_prefixes():
    flat = VerifyCostModel()
    flat.ragged_seconds[3] = {3: 1.0, 60: 1.0}  # verification costs nothing extra: take every draft worth MIN_GAIN
    rates = torch.tensor([[0.9, 0.9, 0.9, 0.9], [0.01, 0.9, 0.9, 0.9], [0.5, 0.5, 0.5, 0.5]])
    lengths = ragged_verify_lens(rates, flat)
    expected = 1 + (rates.cumprod(-1) > MIN_GAIN).sum(-1)
    assert lengths.tolist() == expected.tolist() == [5, 1, 5]
    steep = VerifyCostModel()
    steep.ragged_seconds[3] = {3: 1.0, 4: 1.3, 60: 18.0}  # each extra token costs a third of a step or more
    lengths = ragged_verify_lens(rates, steep)
    assert lengths[1] == 1 and lengths[0] >= lengths[2] >= 1 and lengths[0] > 1
    assert ragged_verify_lens(torch.zeros(2, 0), flat).tolist() == [1, 1]


def test_ragged_cost_falls_back_to_the_rectangular_estimate_then_interpolates():
    cost = VerifyCostModel()
    cost.update(4, 0.040, rows=4)
    cost.update(12, 0.080, rows=4)  # rectangular: 4 rows of 3
    assert cost.cost_ragged(4, 10) == pytest.approx(cost.cost_batch(4, 3))  # nothing ragged measured yet
    cost.update(6, 0.050, rows=4, ragged=True)
    cost.update(10, 0.060, rows=4, ragged=True)
    assert cost.cost_ragged(4, 8) == pytest.approx(0.055)
    cost.update(20, 0.070, rows=4, ragged=True)
    totals = range(4, 40)  # below, between and past the measured counts
    curve = cost.cost_ragged_curve(4, totals)
    assert curve.tolist() == pytest.approx([cost.cost_ragged(4, t) for t in totals])
    assert cost.cost_ragged_curve(3, range(3, 9)).tolist() == pytest.approx(
        [cost.cost_ragged(3, t) for t in range(3, 9)]
    )
