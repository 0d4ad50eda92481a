"""Opt-in end-to-end run on the real smollm2-135m preset (python -m pytest -m real_model)."""

from __future__ import annotations

import pytest
import torch

from adaflash_hf import DraftingConfig, DraftingState, FixedVerifyLength, enable_adaflash, generate, load_target
from adaflash_hf.drafters import load_drafter

pytestmark = pytest.mark.real_model

PROMPTS = [
    "Write a Python function that reverses a string.",
    "What is 17 * 23? Answer briefly.",
    "Name three colours of the rainbow.",
]


@pytest.fixture(scope="module")
def smollm2():
    target, tokenizer = load_target("smollm2-135m", dtype="fp32")
    return target, tokenizer, load_drafter("auto", target, target_name="smollm2-135m")


def test_smollm2_end_to_end_is_lossless(smollm2):
    target, tokenizer, drafter = smollm2
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
        for p in PROMPTS
    ]
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    out = generate(target, drafter, batch.input_ids, batch.attention_mask, max_new_tokens=40, tokenizer=tokenizer)
    enable_adaflash(target)
    for row, text in enumerate(texts):
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids
        plain = target.generate(ids, max_new_tokens=40, do_sample=False)[0, ids.shape[1] :].tolist()
        width = batch.input_ids.shape[1]
        assert out.sequences[row, width : width + out.num_new_tokens[row]].tolist() == plain
        assisted = target.generate(ids, assistant_model=drafter, max_new_tokens=40, do_sample=False)[0, ids.shape[1] :]
        assert assisted.tolist() == plain
    assert tokenizer.decode(out.sequences[0, batch.input_ids.shape[1] :], skip_special_tokens=True).strip()
    assert out.mean_accepted_length >= 1.0


def test_bundled_drafter_accepts_on_held_out_prompts(smollm2):
    """A loaded shipped drafter must draft well, not only losslessly (a loading bug once cut tau to ~1.1)."""
    from adaflash_hf.data import load_prompts
    from adaflash_hf.training.data import chat_prompt_ids

    target, tokenizer, drafter = smollm2
    prompts = list(load_prompts(["math", "code"], split="eval", limit_per_domain=1)["prompt"])
    taus = []
    for prompt in prompts:
        ids = torch.tensor([chat_prompt_ids(tokenizer, prompt)])
        taus.append(
            generate(
                target,
                drafter,
                ids,
                torch.ones_like(ids),
                max_new_tokens=64,
                drafting=DraftingConfig.only("drafter"),
                verify_policy=FixedVerifyLength(),
                drafting_state=DraftingState(),
            ).mean_accepted_length
        )
    assert sum(taus) / len(taus) > 1.3, taus  # measured 1.4-1.8 for the shipped drafter; an untrained one gives ~1.0
    assert (
        drafter.config.draft_vocab_size == 32768 and drafter.adaflash_datastore.num_tokens > 100_000
    )  # shipped with it
