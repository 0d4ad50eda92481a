"""Tiny random targets of two architectures and an oracle test-double drafter."""

from __future__ import annotations

import hashlib
import importlib.util
import sys

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM
from transformers.modeling_outputs import BaseModelOutputWithPast

from adaflash_hf import AdaFlashDrafter

VOCAB = 48  # small, so hidden (64) > vocab and any token can be made the drafter's argmax
EOS = 3


def tiny_target(arch: str, seed: int = 0):
    torch.manual_seed(seed)
    common = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=EOS,
        pad_token_id=0,
    )
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=16, **common))
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = EOS
    return model.eval()


@pytest.fixture(params=["llama", "qwen3"])
def target(request):
    return tiny_target(request.param)


@pytest.fixture
def drafter(target):
    torch.manual_seed(1)
    return AdaFlashDrafter.from_target(target, num_layers=2, block_size=5).eval()


def left_pad(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    return ids, mask


def random_prompts(lengths, seed=0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(4, VOCAB, (n,), generator=g).tolist() for n in lengths]


class OracleDrafter(AdaFlashDrafter):
    """Proposes the target's true greedy continuation, with deterministic injected errors.

    ``references`` maps a row's left-padding width (unique per prompt in a test batch) to its full
    greedy sequence (prompt + continuation, positions from 0). Hidden states are built so that the
    target's lm_head turns them into the intended tokens. ``error_rate`` of draft positions get a
    wrong token, so acceptance lengths vary between rows and rounds; 0 gives full blocks.
    """

    def setup(self, target, references: dict[int, list[int]], error_rate: float):
        weight = target.get_output_embeddings().weight.detach().float()  # (V, H)
        self._inverse = torch.linalg.pinv(weight)  # (H, V)
        self._references, self._error_rate = references, error_rate
        return self

    def forward(self, noise_embeds, context_hidden_states, position_ids=None, attention_mask=None, **kwargs):
        b, q, _ = noise_embeds.shape
        logits = torch.full((b, q, self.config.vocab_size), -30.0)
        for row in range(b):
            pad = 0 if attention_mask is None else int((attention_mask[row].cumsum(0) == 0).sum())
            reference = self._references[pad]
            anchor_pos = int(position_ids[row, -q])
            for k in range(1, q):
                pos = anchor_pos + k
                token = reference[pos] if pos < len(reference) else EOS
                digest = hashlib.sha256(f"{pad}/{pos}/{k}".encode()).digest()[0] / 256
                if digest < self._error_rate:
                    token = (token + 1) % self.config.vocab_size
                logits[row, k, token] = 30.0
        hidden = (logits @ self._inverse.T).to(noise_embeds.dtype)  # lm_head(hidden) == logits
        return BaseModelOutputWithPast(last_hidden_state=hidden)


def greedy_reference(target, prompt: list[int], max_new_tokens: int, eos: bool = True) -> list[int]:
    kwargs = {} if eos else {"eos_token_id": None}
    out = target.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False, **kwargs)
    return out[0].tolist()


def drafter_only(verify_len: int | None = None) -> dict:
    """generate() kwargs that isolate the drafter: its block only, every round (whether it pays is a timing
    measurement, which would make runs differ under load), a fixed verify length, a fresh state."""
    import dataclasses

    from adaflash_hf import DraftingConfig, DraftingState, FixedVerifyLength

    return dict(
        drafting=dataclasses.replace(DraftingConfig.only("drafter"), drafter_every_round=True),
        verify_policy=FixedVerifyLength(verify_len),
        drafting_state=DraftingState(),
    )


def load_script(path, name: str):
    """A Python file that is no package module (a script under benchmarks/), imported by path as ``name``; its
    work stays behind its ``__main__`` guard."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve annotations through the module's entry
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module
