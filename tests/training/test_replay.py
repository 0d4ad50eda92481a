"""The drafter-alone replay: its walk is the engine's rounds, its τ what transformers' DFlash path realises."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from adaflash_hf.modeling_adaflash import AdaFlashDrafter
from adaflash_hf.training.data import TrainingSequence, collate, target_features
from adaflash_hf.training.losses import position_weights
from adaflash_hf.training.replay import ReplayDrafterArgs, block_acceptance, replay_stats, walk
from adaflash_hf.training.step import drafter_block_forward

MASK = 3


def test_walk_moves_past_the_accepted_drafts_and_the_bonus_token():
    assert walk([2, 0, 5, 1, 0, 0, 0]) == [0, 3, 5, 6]
    assert walk([]) == []
    rng = random.Random(0)
    for _ in range(200):  # blocks are cut at the answer's end, so the rounds cover every position once
        n = rng.randint(1, 40)
        accepted = [rng.randint(0, min(7, n - i)) for i in range(n)]
        anchors = walk(accepted)
        assert sum(accepted[a] + 1 for a in anchors) - n in (0, 1)  # 1: the last round's bonus lies past the answer
        assert all(b == a + accepted[a] + 1 for a, b in zip(anchors, anchors[1:], strict=False))


def test_replay_stats_of_hand_made_blocks():
    match = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0], [1, 0, 0], [0, 0, 0]], dtype=torch.bool)
    stats = replay_stats([match])  # a 6-token answer; walk: anchor 0 (2 accepted), anchor 3 (1 accepted)
    assert stats["rounds"] == 2 and stats["tokens"] == 6
    assert stats["tau"] == pytest.approx(6 / 3)  # the prefill and two rounds
    assert stats["tau_every_anchor"] == pytest.approx(1 + 4 / 5)
    assert stats["position_acceptance"] == pytest.approx([1.0, 0.5, 0.0])  # position 3 seen once (anchor 0)


def tiny_target() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None  # the greedy answer runs its full length
    model.generation_config.pad_token_id = 0
    return model


def overfit_drafter(target, sequence: TrainingSequence, steps: int = 10) -> AdaFlashDrafter:
    """A drafter that has half-learnt one answer, so its blocks are accepted in part."""
    torch.manual_seed(0)
    drafter = AdaFlashDrafter.from_target(target, num_layers=1, block_size=4, mask_token_id=MASK).float()
    batch = collate([sequence], pad_token_id=0)
    with torch.no_grad():
        features = target_features(target, batch, drafter.config.target_layer_ids)
    anchors = torch.arange(int(sequence.start), len(sequence.input_ids) - 1)[None]
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=3e-3)
    for _ in range(steps):
        out = drafter_block_forward(
            drafter,
            target,
            batch,
            features,
            anchors,
            torch.ones_like(anchors, dtype=torch.bool),
            position_weights(4, 4.0),
            consistent_labels=True,
        )
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
    return drafter.eval()


def test_replayed_rounds_are_the_rounds_of_transformers_dflash_path():
    """fp32: the walk's round count equals the target forwards DFlash decoding spends after the prefill."""
    target = tiny_target()
    prompt = torch.tensor([[1, 17, 33, 9, 41, 5, 28]])
    new = 40
    with torch.no_grad():
        greedy = target.generate(prompt, max_new_tokens=new, do_sample=False)
    sequence = TrainingSequence(greedy[0], prompt.shape[1] + 0)
    drafter = overfit_drafter(target, sequence)
    match = block_acceptance(drafter, target, sequence, pad_token_id=0)
    stats = replay_stats([match])
    assert 1.5 < stats["tau"] < 3.0, "the test needs a drafter that is accepted in part"

    forwards = []
    hook = target.register_forward_pre_hook(lambda module, args, kwargs: forwards.append(1), with_kwargs=True)
    try:
        with torch.no_grad():
            got = target.generate(
                prompt, assistant_model=drafter, max_new_tokens=new, do_sample=False, speculation_type="dflash"
            )
    finally:
        hook.remove()
    assert torch.equal(got, greedy)
    assert stats["tokens"] == new
    assert len(forwards) == 1 + stats["rounds"]  # the prefill, then one forward per round


def test_bad_arguments_say_what_to_do(tmp_path):
    with pytest.raises(ValueError, match="--drafters is empty"):
        ReplayDrafterArgs(drafters=" , ")
    with pytest.raises(FileNotFoundError, match="no drafter folder"):
        ReplayDrafterArgs(drafters=f"auto,{tmp_path / 'missing'}")
    with pytest.raises(ValueError, match="max_new_tokens"):
        ReplayDrafterArgs(max_new_tokens=1)
