"""The AdaFlash adaptive length head, as a transformers `PreTrainedModel`.

The head reads the drafter's final hidden states for one block ``[anchor, MASK x (B-1)]`` (detached,
(b, B, H)) together with a prior estimate of each draft's acceptance, and predicts, for each draft
position k = 1..B-1, the conditional acceptance rate a_k = P(draft k accepted | drafts < k accepted):
a discrete survival model of the accepted length. The expected number of accepted drafts is
sum_k prod_{j<=k} a_j (DESIGN §2), which a verify-length policy weighs against the measured verify cost.

Architecture (AdaFlash's head, made per-position): for every draft position, features =
[LayerNorm(concat(mean over the block, that position's state)), logit(prior rate)] ->
Linear(2H + 1 -> D) + position embedding -> SiLU -> residual Linear(D -> D) + SiLU -> Linear(D -> 1).
Why the prior: acceptance of the first draft depends mostly on the drafter's confidence in it, which
lives behind the target's lm_head and is out of reach of a small MLP over hidden states; adaflash-hf's
engine already estimates it (its acceptance estimator's rate for the draft's position and top-1
probability), and the hidden states add what that estimate misses (the block's context, later
positions). Measured on held-out prompts in ``docs/research-log.md``.

This file ships to the Hub next to the weights (``trust_remote_code``) and imports only torch and
transformers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.utils import ModelOutput

from .configuration_length_head import AdaFlashLengthHeadConfig


@dataclass
class AdaFlashLengthHeadOutput(ModelOutput):
    """logits (b, B-1): log-odds of each draft's conditional acceptance; rates (b, B-1): their sigmoid."""

    logits: torch.Tensor | None = None
    rates: torch.Tensor | None = None


class AdaFlashLengthHead(PreTrainedModel):
    """Drafter hidden states of a block (b, B, H) and prior rates (b, B-1) -> conditional acceptance rates (b, B-1)."""

    config_class = AdaFlashLengthHeadConfig
    base_model_prefix = ""
    main_input_name = "draft_hidden_states"

    def __init__(self, config: AdaFlashLengthHeadConfig):
        super().__init__(config)
        hidden, width = config.hidden_size, config.head_size
        self.input_norm = nn.LayerNorm(2 * hidden, eps=config.layer_norm_eps)
        self.proj = nn.Linear(2 * hidden + 1, width)
        self.position_embedding = nn.Embedding(config.num_drafts, width)
        self.residual = nn.Linear(width, width)
        self.out = nn.Linear(width, 1)
        self.act = nn.SiLU()
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    def forward(self, draft_hidden_states: torch.Tensor, prior_rates: torch.Tensor) -> AdaFlashLengthHeadOutput:
        r"""
        draft_hidden_states (`(b, B, H)`): the drafter's ``last_hidden_state`` for ``[anchor, MASK x (B-1)]``;
            cast to the head's dtype (the engine's drafter may run in bf16).
        prior_rates (`(b, B-1)`): a prior estimate of each draft's conditional acceptance rate (adaflash-hf's
            engine passes its acceptance estimator's rates, the ``rates`` a verify-length policy receives).
        """
        num_drafts = self.config.num_drafts
        if draft_hidden_states.shape[1:] != (num_drafts + 1, self.config.hidden_size):
            raise ValueError(
                f"the length head expects drafter hidden states of shape (b, {num_drafts + 1}, "
                f"{self.config.hidden_size}) "
                f"(block size {self.config.block_size}, hidden size {self.config.hidden_size}), got "
                f"{tuple(draft_hidden_states.shape)}: load the head that was trained for this drafter."
            )
        if prior_rates.shape != (draft_hidden_states.shape[0], num_drafts):
            raise ValueError(
                f"prior_rates must have shape (b, {num_drafts}) = one rate per draft, got {tuple(prior_rates.shape)}."
            )
        x = draft_hidden_states.to(self.dtype)
        block = x.mean(1, keepdim=True).expand(-1, num_drafts, -1)  # (b, B-1, H)
        features = self.input_norm(torch.cat([block, x[:, 1:]], dim=-1))  # (b, B-1, 2H)
        prior = torch.logit(prior_rates.to(device=x.device, dtype=self.dtype).clamp(1e-4, 1 - 1e-4))[
            ..., None
        ]  # (b, B-1, 1)
        positions = torch.arange(num_drafts, device=x.device)
        h = self.act(
            self.proj(torch.cat([features, prior], dim=-1)) + self.position_embedding(positions)
        )  # (b, B-1, D)
        h = h + self.act(self.residual(h))
        logits = self.out(h).squeeze(-1)  # (b, B-1)
        return AdaFlashLengthHeadOutput(logits=logits, rates=torch.sigmoid(logits))

    @torch.no_grad()
    def expected_accepted_length(
        self, draft_hidden_states: torch.Tensor, prior_rates: torch.Tensor, num_drafts: int | None = None
    ) -> torch.Tensor:
        """E[accepted drafts] (b,) when ``num_drafts`` (default: all B-1) are verified: sum_k prod_{j<=k} a_j."""
        rates = self(draft_hidden_states, prior_rates).rates.float()[:, :num_drafts]
        return rates.cumprod(-1).sum(-1)

    @torch.no_grad()
    def adaflash_verify_len(
        self, draft_hidden_states: torch.Tensor, prior_rates: torch.Tensor, scale: float = 1.3, min_len: int = 1
    ) -> torch.Tensor:
        """AdaFlash's rule (b,) long: clamp(round((1 + E[accepted]) * scale), min_len, B).

        AdaFlash's head predicts (accepted + 1) / B and verifies round(pred * B * 1.3) tokens; here
        (1 + E[accepted]) plays pred * B. It ignores the verify cost, unlike the goodput policy.
        """
        length = (1 + self.expected_accepted_length(draft_hidden_states, prior_rates)) * scale
        return length.round().long().clamp(min_len, self.config.block_size)

    def check_drafter(self, drafter: PreTrainedModel) -> None:
        """Raise a ValueError saying what to do when this head does not fit ``drafter``'s hidden states."""
        hidden, block = drafter.config.hidden_size, drafter.config.block_size
        if (hidden, block) != (self.config.hidden_size, self.config.block_size):
            raise ValueError(
                f"This length head reads drafter hidden states of size {self.config.hidden_size} in blocks of "
                f"{self.config.block_size}, but the drafter has hidden size {hidden} and block size {block}. "
                "Load the head trained for this drafter (length_head='auto' picks the one bundled with it), or train "
                "one with `adaflash train-length-head --drafter <this drafter>`."
            )


def register() -> None:
    """Let AutoConfig/AutoModel resolve saved length heads without trust_remote_code (called by adaflash_hf)."""
    from transformers import AutoConfig, AutoModel

    AutoConfig.register(AdaFlashLengthHeadConfig.model_type, AdaFlashLengthHeadConfig, exist_ok=True)
    AutoModel.register(AdaFlashLengthHeadConfig, AdaFlashLengthHead, exist_ok=True)


AdaFlashLengthHeadConfig.register_for_auto_class()
AdaFlashLengthHead.register_for_auto_class("AutoModel")
