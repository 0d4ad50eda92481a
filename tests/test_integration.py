"""transformers entry points: generate(assistant_model=), pipelines, the built-in DFlash path."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    PreTrainedTokenizerFast,
    StoppingCriteria,
    StoppingCriteriaList,
    pipeline,
)

from adaflash_hf import AdaFlashCandidateGenerator, enable_adaflash, last_generation_stats

from conftest import EOS, VOCAB, OracleDrafter, greedy_reference, random_prompts


def test_generate_with_assistant_matches_greedy(target, drafter):
    prompt = random_prompts((7,))[0]
    ids = torch.tensor([prompt])
    want = target.generate(ids, max_new_tokens=25, do_sample=False)
    assert enable_adaflash(target) is target
    assert enable_adaflash(target) is target  # idempotent
    got = target.generate(ids, assistant_model=drafter, max_new_tokens=25, do_sample=False)
    assert torch.equal(got, want)
    assert isinstance(target.adaflash_last_generator, AdaFlashCandidateGenerator)
    assert last_generation_stats(target).num_rounds > 0


@pytest.mark.parametrize("source", ["drafter", "suffix", "global", "datastore"])
def test_generate_with_assistant_is_lossless_for_every_draft_source(target, drafter, source, tmp_path):
    from adaflash_hf import DraftingConfig, FixedVerifyLength
    from adaflash_hf.decoding.datastore_file import load_datastore, save_datastore
    from adaflash_hf.decoding.drafting_state import default_drafting_state

    prompts = random_prompts((6, 9), seed=13)
    answers = [greedy_reference(target, p, 40, eos=False) for p in prompts]
    save_datastore([a[len(p) :] for a, p in zip(answers, prompts)], tmp_path / "datastore.safetensors")
    drafter.adaflash_datastore = load_datastore(tmp_path / "datastore.safetensors")
    enable_adaflash(
        target, verify_policy=FixedVerifyLength(), drafting=DraftingConfig.only(source)
    )  # no timing in the choices
    for answer in answers:
        default_drafting_state(target).remember(answer)  # earlier requests of this process
    for prompt in prompts:
        ids = torch.tensor([prompt])
        want = target.generate(ids, max_new_tokens=30, do_sample=False, eos_token_id=None)
        got = target.generate(ids, assistant_model=drafter, max_new_tokens=30, do_sample=False, eos_token_id=None)
        assert torch.equal(got, want)
        stats = last_generation_stats(target)
        assert {s for r in stats.rounds for s in r.sources} <= {source, "none"}
    if source != "drafter":  # the tiny target loops, so its own answers are matched and accepted
        assert stats.source_counts()[source][1] > 0


def test_generate_with_oracle_long_acceptance(target, drafter):
    prompt = random_prompts((6,), seed=9)[0]
    enable_adaflash(target)
    want = target.generate(torch.tensor([prompt]), max_new_tokens=30, do_sample=False)
    oracle = (
        OracleDrafter(drafter.config).setup(target, {0: greedy_reference(target, prompt, 60, eos=False)}, 0.1).eval()
    )
    got = target.generate(torch.tensor([prompt]), assistant_model=oracle, max_new_tokens=30, do_sample=False)
    assert torch.equal(got, want)
    assert last_generation_stats(target).mean_accepted_length > 2


def test_return_dict_hidden_states_scores_streamer_and_stopping(target, drafter):
    enable_adaflash(target)
    ids = torch.tensor([random_prompts((5,))[0]])
    want = target.generate(ids, max_new_tokens=12, do_sample=False)
    out = target.generate(
        ids,
        assistant_model=drafter,
        max_new_tokens=12,
        do_sample=False,
        return_dict_in_generate=True,
        output_hidden_states=True,
        output_scores=True,
    )
    assert torch.equal(out.sequences, want)
    assert len(out.scores) == out.sequences.shape[1] - ids.shape[1]
    streamed = []

    class Streamer:
        def put(self, value):
            streamed.extend(value.flatten().tolist())

        def end(self):
            pass

    class StopAfter(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= ids.shape[1] + 4, dtype=torch.bool)

    got = target.generate(
        ids,
        assistant_model=drafter,
        max_new_tokens=12,
        do_sample=False,
        streamer=Streamer(),
        stopping_criteria=StoppingCriteriaList([StopAfter()]),
    )
    assert streamed == got[0].tolist()
    assert got.shape[1] >= ids.shape[1] + 4 and torch.equal(got[0], want[0, : got.shape[1]])


def test_sampling_through_generate(target, drafter):
    enable_adaflash(target)
    ids = torch.tensor([random_prompts((5,))[0]])
    torch.manual_seed(0)
    out = target.generate(ids, assistant_model=drafter, max_new_tokens=10, do_sample=True, temperature=0.7, top_k=10)
    assert out.shape[1] <= ids.shape[1] + 10 and out.max() < VOCAB


def test_builtin_dflash_path_is_lossless(target, drafter):
    ids = torch.tensor([random_prompts((6,))[0]])
    want = target.generate(ids, max_new_tokens=15, do_sample=False)
    got = target.generate(ids, assistant_model=drafter, max_new_tokens=15, do_sample=False, speculation_type="dflash")
    assert torch.equal(got, want)


def test_stock_assisted_and_prompt_lookup_unchanged(target):
    enable_adaflash(target)
    ids = torch.tensor([random_prompts((6,))[0] * 2])
    want = target.generate(ids, max_new_tokens=10, do_sample=False)
    assert torch.equal(target.generate(ids, max_new_tokens=10, do_sample=False, prompt_lookup_num_tokens=3), want)
    assistant = AutoModelForCausalLM.from_config(target.config).eval()
    assert torch.equal(target.generate(ids, assistant_model=assistant, max_new_tokens=10, do_sample=False), want)


def test_without_enable_the_error_says_what_to_do(drafter):
    from conftest import tiny_target

    plain = tiny_target("llama", seed=3)
    with pytest.raises(ValueError, match="enable_adaflash"):
        plain.generate(torch.tensor([[5, 6, 7]]), assistant_model=drafter, max_new_tokens=3)


def word_tokenizer():
    vocab = {"<pad>": 0, "<s>": 1, "<unk>": 2, "</s>": EOS}
    vocab.update({f"w{i}": i for i in range(4, VOCAB)})
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def test_pipeline_with_assistant_matches_plain_pipeline(target, drafter):
    tokenizer = word_tokenizer()
    prompt = " ".join(f"w{t}" for t in random_prompts((8,), seed=11)[0])
    plain = pipeline("text-generation", model=target, tokenizer=tokenizer)
    want = plain(prompt, max_new_tokens=15, do_sample=False)[0]["generated_text"]
    enable_adaflash(target)
    fast = pipeline("text-generation", model=target, tokenizer=tokenizer, assistant_model=drafter)
    got = fast(prompt, max_new_tokens=15, do_sample=False)[0]["generated_text"]
    assert got == want
    assert target.adaflash_last_generator.stats.num_rounds > 0


def test_batched_generate_points_to_the_batched_engine(target, drafter):
    enable_adaflash(target)
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    with pytest.raises(ValueError, match="adaflash_hf.generate"):
        target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=drafter, max_new_tokens=3)
