"""Tests for adaflash_hf.training: loss identities, anchor/mask invariants, training == inference
forward, and a tiny end-to-end run that checkpoints and resumes (tiny random models, CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from adaflash_hf.modeling_adaflash import AdaFlashDrafter
from adaflash_hf.training import TrainDrafterConfig, train_drafter
from adaflash_hf.training.anchors import (
    block_attention_mask,
    block_input_ids,
    block_labels,
    block_position_ids,
    sample_anchors,
)
from adaflash_hf.training.checkpointing import export_checkpoint
from adaflash_hf.training.losses import (
    clipped_reverse_kl,
    decayed_cross_entropy,
    decayed_forward_kl,
    opd_loss,
    position_weights,
    reach_weights,
)
from adaflash_hf.training.step import acceptance_counts, drafter_block_forward

MASK = 3


def tiny_target(vocab: int = 64, layers: int = 4) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config).eval()


# ---------------------------------------------------------------------------------------------- losses


def test_position_weights_decay_exponentially():
    w = position_weights(16, 7.0)
    assert w.shape == (15,) and w[0] == 1.0
    torch.testing.assert_close(w[1:] / w[:-1], torch.full((14,), float(torch.exp(torch.tensor(-1 / 7)))))
    assert position_weights(8, 4.0, num_positions=3).shape == (3,)
    with pytest.raises(ValueError, match="num_positions"):
        position_weights(8, 4.0, num_positions=8)


def test_cross_entropy_vanishes_on_confident_correct_logits_and_ignores_masked():
    labels = torch.tensor([[1, 4, -100], [0, 2, 3]])
    logits = torch.nn.functional.one_hot(labels.clamp_min(0), 5).float() * 100.0  # (N, K, V)
    w = position_weights(4, 2.0)
    assert decayed_cross_entropy(logits, labels, w) < 1e-6
    wrong = logits.clone()
    wrong[1, 2] = 0.0  # uniform at one position: CE = log 5 there
    expected = w[2] * torch.log(torch.tensor(5.0)) / (w.sum() * 2 - w[2])
    torch.testing.assert_close(decayed_cross_entropy(wrong, labels, w), expected)
    garbage = logits.clone()
    garbage[0, 2] = torch.randn(5) * 50  # an ignored position changes nothing
    assert decayed_cross_entropy(garbage, labels, w) < 1e-6


def test_forward_kl_zero_on_identical_inputs_and_equals_ce_for_one_hot_targets():
    logits, labels, w = torch.randn(3, 4, 11), torch.randint(0, 11, (3, 4)), position_weights(5, 2.0)
    assert decayed_forward_kl(logits, logits, labels, w) < 1e-6
    one_hot = torch.nn.functional.one_hot(labels, 11).float() * 100.0  # the target is certain of its label
    torch.testing.assert_close(decayed_forward_kl(logits, one_hot, labels, w), decayed_cross_entropy(logits, labels, w))


def test_reverse_kl_zero_on_identical_inputs_and_clipping_stops_gradients():
    logits = torch.randn(3, 4, 11)
    torch.testing.assert_close(clipped_reverse_kl(logits, logits, clip=0.01), torch.zeros(3, 4), atol=1e-6, rtol=0)
    draft = torch.randn(2, 11, requires_grad=True)
    target = torch.randn(2, 11)
    target[0] = draft[0].detach() + 1e-3 * torch.randn(11)  # tiny KL: below the clip
    kl = clipped_reverse_kl(draft, target, clip=0.01)
    assert kl[0] < 0.01 and kl[1] == 0.01  # row 1 is far: clipped
    kl.sum().backward()
    assert draft.grad[1].abs().max() == 0 and draft.grad[0].abs().max() > 0


def test_opd_loss_is_ce_when_alpha_one_and_kl_mix_otherwise():
    draft, target = torch.randn(2, 3, 7), torch.randn(2, 3, 7)
    labels = torch.randint(0, 7, (2, 3))
    w = position_weights(4, 2.0)
    torch.testing.assert_close(opd_loss(draft, target, labels, w, alpha=1.0), decayed_cross_entropy(draft, labels, w))
    mixed = opd_loss(draft, target, labels, w, alpha=0.8, clip=0.01)
    ce = decayed_cross_entropy(draft, labels, w)
    assert 0.8 * ce <= mixed <= 0.8 * ce + 0.2 * 0.01 + 1e-6


def test_reach_weights_are_the_drafters_probability_of_getting_that_far():
    p = torch.tensor([[0.5, 0.4, 0.9, 0.2], [1.0, 1.0, 1.0, 1.0]], requires_grad=True)
    w = reach_weights(p.log())
    torch.testing.assert_close(w, torch.tensor([[1.0, 0.5, 0.2, 0.18], [1.0, 1.0, 1.0, 1.0]]))
    assert not w.requires_grad  # the weights steer the loss; they are not optimised
    # a label the drafter cannot emit (log p = -inf) ends the block: nothing after it weighs anything, no NaN
    blocked = reach_weights(torch.tensor([0.0, -float("inf"), 0.0]))
    assert blocked[:2].tolist() == [1.0, 1.0] and 0 <= blocked[2] < 1e-12


def test_reach_weighted_forward_weighs_each_position_by_the_blocks_own_reach():
    """drafter_block_forward with reach weighting == CE weighted by the running product of the drafter's own
    label probabilities, recomputed here from the logits it saw; positions after a certain miss get no gradient."""
    from adaflash_hf.training.data import TrainingSequence, collate, target_features

    target = tiny_target().float()
    torch.manual_seed(3)
    drafter = AdaFlashDrafter.from_target(target, num_layers=1, block_size=4, mask_token_id=MASK).float()
    ids = torch.randint(4, 64, (2, 20))
    batch = collate([TrainingSequence(input_ids=row, start=2) for row in ids], pad_token_id=2)
    features = target_features(target, batch, drafter.config.target_layer_ids)
    anchors, valid = torch.tensor([[3, 9], [5, 12]]), torch.ones(2, 2, dtype=torch.bool)
    decay = position_weights(4, 4.0)
    # labels the target's argmax at every position (no consistency cut): every block position is labelled
    plain = drafter_block_forward(drafter, target, batch, features, anchors, valid, decay, False)
    reach = drafter_block_forward(drafter, target, batch, features, anchors, valid, decay, False, reach_weighted=True)
    assert torch.equal(plain.labels, reach.labels) and bool((plain.labels != -100).all())

    assert drafter.draft_vocab is None  # the full vocabulary: the labels index the logits directly
    with torch.no_grad():  # the same forward, by hand
        hidden = drafter(
            noise_embeds=target.get_input_embeddings()(block_input_ids(batch.input_ids, anchors, 4, MASK)),
            context_hidden_states=features.context,
            position_ids=torch.cat([torch.arange(20).expand(2, -1), block_position_ids(anchors, 4)], dim=1),
            attention_mask=block_attention_mask(anchors, 20, 4, torch.float32),
        ).last_hidden_state.view(2, 2, 4, -1)[:, :, 1:]
        lp = torch.log_softmax(target.get_output_embeddings()(hidden), -1).gather(-1, reach.labels[..., None])[..., 0]
    w = torch.exp(torch.cumsum(lp, -1) - lp)  # (b, A, K): 1, p_1, p_1 p_2
    assert bool((w[..., 0] == 1).all()) and bool((w[..., 1:] < 1).all())
    torch.testing.assert_close(reach.loss, -(lp * w).sum() / w.sum(), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(plain.loss, -(lp * decay).sum() / (decay.sum() * 4), atol=1e-5, rtol=1e-4)
    assert not torch.allclose(reach.loss, plain.loss)


# ---------------------------------------------------------------------------------------------- anchors


def test_anchors_lie_inside_the_label_region():
    label_mask = torch.zeros(3, 30, dtype=torch.bool)
    label_mask[0, 10:30] = True
    label_mask[1, 5:9] = True  # 3 candidates only
    label_mask[2, 1:20] = True
    anchors, valid = sample_anchors(label_mask, 8, torch.Generator().manual_seed(0))
    assert valid.sum(1).tolist() == [8, 3, 8]
    for row in range(3):
        a = anchors[row][valid[row]]
        assert (label_mask[row, a] & label_mask[row, a + 1]).all()
        assert (a[1:] > a[:-1]).all()  # distinct and sorted


def test_block_mask_sees_only_earlier_context_and_its_own_block():
    anchors = torch.tensor([[2, 5, 9]])
    bs, length = 4, 12
    mask = block_attention_mask(anchors, length, bs, torch.float32)[0, 0] == 0  # (A*B, L + A*B) visible
    assert mask.shape == (12, 24)
    for j, a in enumerate(anchors[0].tolist()):
        rows = mask[j * bs : (j + 1) * bs]
        assert rows[:, :a].all() and not rows[:, a:length].any()  # context strictly before the anchor
        blocks = rows[:, length:].view(bs, 3, bs)
        assert blocks[:, j].all()  # bidirectional inside the block
        assert not blocks[:, [i for i in range(3) if i != j]].any()  # nothing of other blocks
    assert block_position_ids(anchors, bs).tolist() == [[2, 3, 4, 5, 5, 6, 7, 8, 9, 10, 11, 12]]
    ids = torch.arange(12)[None] + 10
    assert block_input_ids(ids, anchors, bs, MASK).tolist() == [[12, 3, 3, 3, 15, 3, 3, 3, 19, 3, 3, 3]]


def test_block_labels_stop_at_sequence_end_and_at_the_first_disagreement():
    input_ids = torch.arange(10)[None]
    labels = input_ids.clone()
    labels[0, 4] = 99  # the target would not have produced token 4
    label_mask = torch.ones(1, 10, dtype=torch.bool)
    anchors, valid = torch.tensor([[1, 7]]), torch.tensor([[True, True]])
    out = block_labels(labels, label_mask, anchors, valid, 4)
    assert out.tolist() == [[[2, 3, 99], [8, 9, -100]]]
    consistent = block_labels(labels, label_mask, anchors, valid, 4, input_ids=input_ids)
    assert consistent.tolist() == [[[2, 3, 99], [8, 9, -100]]]  # label at 4 is kept, prefix 2, 3 agrees
    consistent = block_labels(labels, label_mask, torch.tensor([[3, 7]]), valid, 4, input_ids=input_ids)
    assert consistent[0, 0].tolist() == [99, -100, -100]  # text token 4 != greedy 99: later labels dropped


def test_acceptance_counts_leading_matches():
    labels = torch.tensor([[[1, 2, 3], [4, 5, -100], [-100, -100, -100]]])
    predictions = torch.tensor([[[1, 0, 3], [4, 5, -100], [-100, -100, -100]]])
    accepted, hits, seen = acceptance_counts(predictions, labels)
    assert accepted.tolist() == [1, 2]
    assert hits.tolist() == [2, 1, 0] and seen.tolist() == [2, 2, 0]


# ---------------------------------------------------------------------------------------------- equivalence


def test_training_forward_equals_incremental_inference_forward():
    """All blocks at once with the 4-D training mask == the engine's rounds through a DynamicCache."""
    target = tiny_target().float()
    drafter = AdaFlashDrafter.from_target(target, num_layers=2, block_size=4, mask_token_id=MASK).float().eval()
    torch.manual_seed(1)
    length, bs = 16, 4
    ids = torch.randint(4, 64, (1, length))
    with torch.no_grad():
        hidden = target(ids, output_hidden_states=True).hidden_states
        context = torch.cat([hidden[i + 1] for i in drafter.config.target_layer_ids], dim=-1)  # (1, L, n*H)
        anchors = torch.tensor([[3, 7, 12]])
        embeds = target.get_input_embeddings()(block_input_ids(ids, anchors, bs, MASK))
        train_out = drafter(
            noise_embeds=embeds,
            context_hidden_states=context,
            position_ids=torch.cat([torch.arange(length)[None], block_position_ids(anchors, bs)], dim=1),
            attention_mask=block_attention_mask(anchors, length, bs, torch.float32),
        ).last_hidden_state.view(1, 3, bs, -1)  # (1, A, B, H)

        cache, fed = DynamicCache(), 0
        for j, a in enumerate(anchors[0].tolist()):
            block = embeds.view(1, 3, bs, -1)[:, j]
            positions = torch.cat([torch.arange(fed, a), torch.arange(a, a + bs)])[None]
            inference = drafter(
                noise_embeds=block,
                context_hidden_states=context[:, fed:a],
                position_ids=positions,
                attention_mask=torch.ones(1, a + bs, dtype=torch.long),
                cache=cache,
            ).last_hidden_state
            cache.crop(-bs)  # as the engine: keep the context, drop the block
            fed = a
            torch.testing.assert_close(train_out[:, j], inference, atol=1e-5, rtol=1e-4)
            lm_head = target.get_output_embeddings()
            assert torch.equal(lm_head(train_out[:, j, 1:]).argmax(-1), lm_head(inference[:, 1:]).argmax(-1))


# ---------------------------------------------------------------------------------------------- end to end


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level tokenizer: 256 byte tokens after 4 specials, with a ChatML template."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2, "<mask>": 3}
    vocab.update({ch: i + 4 for i, ch in enumerate(sorted(alphabet))})
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
        additional_special_tokens=["<mask>"],
    )
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    return tokenizer


def chat_target(layers: int = 4) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """A tiny target over the byte tokenizer, generating up to its end-of-turn token (id 2)."""
    tokenizer = byte_tokenizer()
    target = tiny_target(vocab=len(tokenizer), layers=layers)
    target.generation_config.eos_token_id = 2
    target.generation_config.pad_token_id = 2
    return target, tokenizer


# the target and the shape of the tiny training runs (with chat_target)
TINY_RUN = dict(target="tiny", target_dtype="fp32", block_size=4, num_anchors=8, seq_len=32, train_domains=["math"])
# their held-out data and evaluation: two prompts per domain, short answers, no engine check
TINY_EVAL = dict(
    eval_prompts_per_domain=2,
    gen_max_new_tokens=6,
    gen_batch_size=2,
    eval_anchors=4,
    eval_every=100,
    checkpoint_every=100,
    warmup_steps=1,
    engine_eval_prompts=0,
)


def test_tiny_run_checkpoints_and_resumes(tmp_path, caplog):
    target, tokenizer = chat_target(layers=4)
    common = dict(
        output_dir=str(tmp_path / "run"),
        **TINY_RUN,
        corpus_fraction=0.5,
        corpus_limit_per_domain=4,
        self_gen_prompts_per_domain=2,
        eval_prompts_per_domain=2,
        gen_max_new_tokens=6,
        gen_batch_size=2,
        eval_anchors=4,
        eval_every=2,
        checkpoint_every=2,
        warmup_steps=1,
        engine_eval_prompts=1,
        distill_weight=0.5,
    )
    final = train_drafter(TrainDrafterConfig(max_steps=3, **common), target, tokenizer)
    summary = json.loads((final / "training_summary.json").read_text())
    assert summary["steps"] == 3 and summary["mask_token_id"] == 3
    assert (final / "model.safetensors").exists()
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["step_2", "step_3"]
    loaded = AdaFlashDrafter.from_pretrained(final)
    assert loaded.dtype == torch.bfloat16 and loaded.config.block_size == 4
    exported = AdaFlashDrafter.from_pretrained(
        export_checkpoint(tmp_path / "run" / "checkpoints" / "step_3", tmp_path / "exp")
    )
    for (name, a), (_, b) in zip(loaded.state_dict().items(), exported.state_dict().items(), strict=True):
        assert torch.equal(a, b), name  # the last checkpoint is the final drafter

    first_leg = torch.load(tmp_path / "run" / "checkpoints" / "step_3" / "checkpoint.pt", weights_only=False)["state"]
    with (tmp_path / "run" / "metrics.jsonl").open("a") as f:  # a process killed after logging past its checkpoint
        f.write(json.dumps({"kind": "eval", "step": 4, "lost": True}) + "\n")
    with caplog.at_level("INFO", logger="adaflash_hf.training.trainer"):
        train_drafter(TrainDrafterConfig(max_steps=5, **common), target, tokenizer)
    assert "resumed from" in caplog.text and "(step 3)" in caplog.text
    summary = json.loads((final / "training_summary.json").read_text())
    assert summary["steps"] == 5
    assert summary["wall_minutes"] > first_leg["wall_minutes"] > 0  # wall time adds up over resumed processes
    evals = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in evals if r["kind"] == "eval"] == [2, 3, 4, 5]  # step 4 logged once, by the resumed run
    assert not any(r.get("lost") for r in evals)
    train_steps = [r["step"] for r in evals if r["kind"] == "train"]
    assert train_steps == sorted(set(train_steps))
    assert (tmp_path / "run" / "curves.png").exists()


def test_config_validates_with_clear_errors():
    with pytest.raises(ValueError, match="block_size"):
        TrainDrafterConfig(output_dir="x", block_size=1)
    with pytest.raises(ValueError, match="loss_positions"):
        TrainDrafterConfig(output_dir="x", block_size=8, loss_positions=8)
    with pytest.raises(ValueError, match="corpus_fraction"):
        TrainDrafterConfig(output_dir="x", corpus_fraction=1.5)
    with pytest.raises(ValueError, match="position_weighting 'fixed' is not allowed: choose one of decay, reach"):
        TrainDrafterConfig(output_dir="x", position_weighting="fixed")
    with pytest.raises(ValueError, match="feature_cache_shards 3: needs --feature-cache"):
        TrainDrafterConfig(output_dir="x", feature_cache_shards=3)
    assert TrainDrafterConfig(output_dir="x", block_size=16).gamma == 7.0


def test_steps_per_forward_reuses_one_target_forward_and_intermediate_size_is_applied(tmp_path, monkeypatch):
    import adaflash_hf.training.trainer as trainer_module

    target, tokenizer = chat_target(layers=4)
    calls = []
    real = trainer_module.target_features
    monkeypatch.setattr(trainer_module, "target_features", lambda *a, **k: calls.append(1) or real(*a, **k))
    common = dict(
        **TINY_RUN,
        corpus_fraction=1.0,
        corpus_limit_per_domain=4,
        **TINY_EVAL,
        max_steps=6,
        intermediate_size=16,
    )
    for reuse, expected in ((1, 6), (3, 2)):
        calls.clear()
        final = train_drafter(
            TrainDrafterConfig(output_dir=str(tmp_path / f"r{reuse}"), steps_per_forward=reuse, **common),
            target,
            tokenizer,
        )
        assert len(calls) == expected + 1  # training forwards + the final held-out evaluation (one batch)
        config = AdaFlashDrafter.from_pretrained(final).config
        assert config.intermediate_size == 16
        assert config.target_layer_ids == [0, 1, 2, 3]  # default: up to 5 context layers, here all 4 of the tiny target
    with pytest.raises(ValueError, match="steps_per_forward"):
        TrainDrafterConfig(output_dir="x", steps_per_forward=0)


def test_init_from_continues_a_trained_drafter_with_a_reduced_draft_vocabulary(tmp_path):
    target, tokenizer = chat_target(layers=4)
    common = dict(
        **TINY_RUN,
        corpus_fraction=0.5,
        corpus_limit_per_domain=4,
        self_gen_prompts_per_domain=2,
        **{**TINY_EVAL, "engine_eval_prompts": 1},
        max_steps=2,
        data_dir=str(tmp_path / "data"),
    )
    first = train_drafter(TrainDrafterConfig(output_dir=str(tmp_path / "a"), **common), target, tokenizer)
    second = train_drafter(
        TrainDrafterConfig(
            output_dir=str(tmp_path / "b"), init_from=str(first), draft_vocab_size=40, lr=1e-12, **common
        ),
        target,
        tokenizer,
    )
    before, after = AdaFlashDrafter.from_pretrained(first), AdaFlashDrafter.from_pretrained(second)
    assert after.config.draft_vocab_size == 40 and len(set(after.draft_vocab.tolist())) == 40
    assert 2 in after.draft_vocab.tolist()  # EOS is always draftable
    summary = json.loads((second / "training_summary.json").read_text())
    assert summary["held_out_at_init"]["tau"] >= 1.0 and summary["recipe"]["init_from"] == str(first)
    resumed = train_drafter(  # two steps more: resumes from the checkpoint, and the summary keeps the start
        TrainDrafterConfig(
            output_dir=str(tmp_path / "b"),
            init_from=str(first),
            draft_vocab_size=40,
            lr=1e-12,
            **{**common, "max_steps": 4},
        ),
        target,
        tokenizer,
    )
    assert (
        json.loads((resumed / "training_summary.json").read_text())["held_out_at_init"] == summary["held_out_at_init"]
    )
    for name, weight in before.state_dict().items():  # lr ~ 0: the run started from the first drafter's weights
        assert torch.allclose(weight.float(), after.state_dict()[name].float(), atol=1e-2), name
    with pytest.raises(ValueError, match="block size 4"):
        train_drafter(
            TrainDrafterConfig(output_dir=str(tmp_path / "c"), init_from=str(first), **{**common, "block_size": 8}),
            target,
            tokenizer,
        )


def test_grown_drafter_starts_as_the_same_function_and_saves_its_new_depth(tmp_path):
    from adaflash_hf.training.init import grow_drafter

    target, tokenizer = chat_target(layers=4)
    torch.manual_seed(0)
    drafter = AdaFlashDrafter.from_target(target, 1, 4).float().eval()
    hidden = drafter.config.hidden_size
    noise = torch.randn(2, 4, hidden)
    context = torch.randn(2, 6, len(drafter.config.target_layer_ids) * hidden)
    positions = torch.arange(10).expand(2, -1)
    before = drafter(noise, context, position_ids=positions).last_hidden_state
    grow_drafter(drafter, 2)
    assert drafter.config.num_hidden_layers == 3 and len(drafter.layers) == 3
    assert torch.equal(drafter(noise, context, position_ids=positions).last_hidden_state, before)
    assert drafter.layers[2].self_attn.q_proj.weight.abs().sum() > 0  # only the output projections start at zero

    common = dict(**TINY_RUN, corpus_fraction=1.0, corpus_limit_per_domain=4, **TINY_EVAL, max_steps=2)
    first = train_drafter(TrainDrafterConfig(output_dir=str(tmp_path / "a"), **common), target, tokenizer)
    grown = train_drafter(
        TrainDrafterConfig(output_dir=str(tmp_path / "b"), init_from=str(first), add_layers=2, **common),
        target,
        tokenizer,
    )
    reloaded = AdaFlashDrafter.from_pretrained(grown)
    assert reloaded.config.num_hidden_layers == 3
    assert reloaded.layers[2].mlp.down_proj.weight.abs().sum() > 0  # the new layers trained
    with pytest.raises(ValueError, match="--init-from"):
        TrainDrafterConfig(output_dir="x", add_layers=1)
    with pytest.raises(ValueError, match="add_layers must be >= 0"):
        TrainDrafterConfig(output_dir="x", init_from="auto", add_layers=-1)


def saved_tiny_target(folder):
    """A tiny target with the byte tokenizer, saved to ``folder`` so commands can load it by path."""
    target, tokenizer = chat_target(layers=2)
    target.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return target


def test_generate_data_answers_a_users_prompt_file(tmp_path):
    from adaflash_hf.training.data import _read_shard, generate_data
    from adaflash_hf.training.data_configs import GenerateDataConfig

    target = saved_tiny_target(tmp_path / "target")
    lines = [
        {"prompt": "hello there", "domain": "chat"},
        {"prompt": "second chat", "domain": "chat"},
        {"prompt": "1 + 2 =", "domain": "math"},
    ]
    (tmp_path / "mine.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    config = GenerateDataConfig(
        data_dir=str(tmp_path / "data"),
        target=str(tmp_path / "target"),
        target_dtype="fp32",
        prompts=str(tmp_path / "mine.jsonl"),
        prompts_per_domain=1,
        max_new_tokens=5,
        batch_size=2,
    )
    assert generate_data(config) == 0
    shards = list((tmp_path / "data" / "train").glob("*/shard_*.safetensors"))
    sequences = [s for shard in shards for s in _read_shard(shard)]
    assert len(sequences) == 2  # one prompt per domain: the first chat line and the math line
    for seq in sequences:  # each cached response is the target's own greedy continuation
        prompt = seq.input_ids[: seq.start][None]
        expected = target.generate(
            prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=5, pad_token_id=2
        )[0, seq.start :]
        end = next((j + 1 for j, t in enumerate(expected.tolist()) if t == 2), len(expected))
        assert seq.input_ids[seq.start :].tolist() == expected[:end].tolist()

    (tmp_path / "bad.jsonl").write_text('{"text": "no prompt key"}\n')
    with pytest.raises(ValueError, match="bad.jsonl: 1 bad line"):  # checked before any model loads
        generate_data(
            GenerateDataConfig(
                data_dir=str(tmp_path / "data"), target="no-such-model", prompts=str(tmp_path / "bad.jsonl")
            )
        )


def test_generate_data_samples_several_answers_per_prompt_reproducibly(tmp_path):
    from adaflash_hf.training.data import _read_shard, generate_data
    from adaflash_hf.training.data_configs import GenerateDataConfig

    saved_tiny_target(tmp_path / "target")
    (tmp_path / "mine.jsonl").write_text(json.dumps({"prompt": "tell me a story", "domain": "chat"}) + "\n")
    common = dict(
        target=str(tmp_path / "target"),
        target_dtype="fp32",
        prompts=str(tmp_path / "mine.jsonl"),
        max_new_tokens=12,
        batch_size=2,
    )

    def answers(data_dir: str, **kwargs) -> list[list[int]]:
        assert generate_data(GenerateDataConfig(data_dir=data_dir, **common, **kwargs)) == 0
        folders = sorted(
            (Path(data_dir) / "train").iterdir(), key=lambda f: json.loads((f / "meta.json").read_text())["decoding"]
        )
        return [
            s.input_ids[s.start :].tolist()
            for f in folders
            for shard in sorted(f.glob("shard_*"))
            for s in _read_shard(shard)
        ]

    greedy = answers(str(tmp_path / "greedy"))
    sampled = answers(str(tmp_path / "a"), temperature=1.5, samples_per_prompt=3)
    assert len(greedy) == 1 and len(sampled) == 3  # one folder per sample, next to the greedy ones
    assert len({tuple(a) for a in sampled}) > 1  # a tiny random model at temperature 1.5 rarely repeats itself
    assert answers(str(tmp_path / "b"), temperature=1.5, samples_per_prompt=3) == sampled  # seeded per sample and shard
    with pytest.raises(ValueError, match="needs --temperature"):
        GenerateDataConfig(data_dir=str(tmp_path), samples_per_prompt=2)
    with pytest.raises(ValueError, match="temperature"):
        GenerateDataConfig(data_dir=str(tmp_path), temperature=-1.0)


def test_training_on_cached_answers_only_needs_some(tmp_path):
    target, tokenizer = chat_target(layers=2)
    config = TrainDrafterConfig(
        output_dir=str(tmp_path / "run"),
        **TINY_RUN,
        **TINY_EVAL,
        corpus_fraction=0.0,
        data_dir=str(tmp_path / "data"),
        self_gen_cached_only=True,
        max_steps=1,
    )
    with pytest.raises(ValueError, match="no self-generated responses under .*generate-data.*--self-gen-cached-only"):
        train_drafter(config, target, tokenizer)
