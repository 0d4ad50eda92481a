"""The AdaFlash block-diffusion drafter (DFlash architecture), as a transformers `PreTrainedModel`.

One forward pass turns a block ``[anchor, MASK x (B-1)]`` into hidden states for every block
position; the target's lm_head maps positions 1..B-1 to draft tokens. The drafter reads the target's
hidden states (``context``) from a few of its layers: they are concatenated, projected by ``fc`` and
normalised by ``hidden_norm``, and every draft layer attends over ``[context ; block]`` keys/values
with queries from the block only. The block is bidirectional; positions are absolute RoPE positions.

Read bottom-up: norm -> rotary -> attention -> layer -> model. This file ships to the Hub next to the
weights (``trust_remote_code``) and imports only torch and transformers. Weight names match the
published z-lab DFlash checkpoints (``layers.N.self_attn.q_proj``, ``fc``, ``hidden_norm``, ``norm``).
"""

from __future__ import annotations

import torch
from safetensors import SafetensorError
from torch import nn
from transformers import PreTrainedModel
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPast
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .configuration_adaflash import AdaFlashDrafterConfig, default_target_layer_ids


class AdaFlashRMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class AdaFlashRotaryEmbedding(nn.Module):
    """RoPE with the target's parameters, so draft positions line up with the target's."""

    def __init__(self, config: AdaFlashDrafterConfig):
        super().__init__()
        self.config = config
        inv_freq, self.attention_scaling = self.compute_inv_freq()
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def compute_inv_freq(self) -> tuple[torch.Tensor, float]:
        config = self.config
        rope_type = config.rope_parameters.get("rope_type", "default")
        if rope_type == "default":
            base = config.rope_parameters["rope_theta"]
            dim = config.head_dim
            return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), 1.0
        return ROPE_INIT_FUNCTIONS[rope_type](config, None)

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.LongTensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq.to(x.device)  # (B, T, hd/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (B, T, hd)
        return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """RoPE where keys span ``[context ; block]`` and queries only the block (the last q_len positions)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (B, 1, T, hd)
    q_len = q.shape[-2]
    q = q * cos[..., -q_len:, :] + rotate_half(q) * sin[..., -q_len:, :]
    k = k * cos + rotate_half(k) * sin
    return q, k


def eager_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Reference attention: (B, nh, q, hd) x (B, nkv, kv, hd) -> (B, q, nh, hd)."""
    key = key.repeat_interleave(module.num_key_value_groups, dim=1)
    value = value.repeat_interleave(module.num_key_value_groups, dim=1)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling  # (B, nh, q, kv)
    if attention_mask is not None:
        scores = scores + attention_mask
    probs = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    probs = nn.functional.dropout(probs, p=dropout, training=module.training)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs


class AdaFlashMLP(nn.Module):
    def __init__(self, config: AdaFlashDrafterConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class AdaFlashAttention(nn.Module):
    """Block queries attend to keys/values projected from ``[context ; block]``."""

    def __init__(self, config: AdaFlashDrafterConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        self.is_causal = False
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, config.num_attention_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(config.num_attention_heads * self.head_dim, config.hidden_size, bias=bias)
        if config.qk_norm:
            self.q_norm = AdaFlashRMSNorm(self.head_dim, eps=config.rms_norm_eps)
            self.k_norm = AdaFlashRMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def forward(self, hidden_states, context, position_embeddings, attention_mask, cache, **kwargs):
        bsz, q_len, _ = hidden_states.shape
        kv_states = torch.cat([context, hidden_states], dim=1)  # (B, ctx + q, H)
        query = self.q_proj(hidden_states).view(bsz, q_len, -1, self.head_dim)  # (B, q, nh, hd)
        key = self.k_proj(kv_states).view(bsz, kv_states.shape[1], -1, self.head_dim)  # (B, kv, nkv, hd)
        value = self.v_proj(kv_states).view(bsz, kv_states.shape[1], -1, self.head_dim)
        if self.config.qk_norm:
            query, key = self.q_norm(query), self.k_norm(key)
        query, key, value = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)  # (B, n, T, hd)
        query, key = apply_rotary(query, key, *position_embeddings)
        if cache is not None:
            key, value = cache.update(key, value, self.layer_idx)

        impl = self.config._attn_implementation
        attention = eager_attention if impl in (None, "eager") else ALL_ATTENTION_FUNCTIONS[impl]
        output, _ = attention(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=self.config.attention_dropout if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )
        return self.o_proj(output.reshape(bsz, q_len, -1))


class AdaFlashDecoderLayer(nn.Module):
    def __init__(self, config: AdaFlashDrafterConfig, layer_idx: int):
        super().__init__()
        self.self_attn = AdaFlashAttention(config, layer_idx)
        self.mlp = AdaFlashMLP(config)
        self.input_layernorm = AdaFlashRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = AdaFlashRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden_states, context, position_embeddings, attention_mask, cache, **kwargs):
        # The context enters un-normalised per layer, as in DFlash: it is normalised once by hidden_norm.
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states = residual + self.self_attn(
            hidden_states, context, position_embeddings, attention_mask, cache, **kwargs
        )
        residual = hidden_states
        return residual + self.mlp(self.post_attention_layernorm(hidden_states))


class AdaFlashPreTrainedModel(PreTrainedModel):
    config_class = AdaFlashDrafterConfig
    base_model_prefix = ""
    main_input_name = "noise_embeds"
    supports_gradient_checkpointing = False
    _no_split_modules = ["AdaFlashDecoderLayer"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_attention_backend = True

    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, AdaFlashRMSNorm):
            nn.init.ones_(module.weight)
        elif isinstance(module, AdaFlashRotaryEmbedding):
            # A non-persistent buffer: from_pretrained allocates it empty, so it must be recomputed here.
            with torch.no_grad():
                module.inv_freq.copy_(module.compute_inv_freq()[0])


def expand_attention_mask(
    attention_mask: torch.Tensor | None, query_length: int, dtype: torch.dtype, attn_implementation: str | None
) -> torch.Tensor | None:
    """2-D key-validity mask (B, kv) -> additive (B, 1, q, kv) mask; every valid key is visible to every query.

    The block is bidirectional and all context precedes it, so no causal structure is needed. A 4-D
    mask (e.g. the training mask over many blocks) passes through unchanged; flash attention takes
    the 2-D mask itself.
    """
    if attention_mask is None or attention_mask.dim() == 4:
        return attention_mask
    if attn_implementation is not None and "flash" in attn_implementation:
        return None if bool(attention_mask.all()) else attention_mask
    if bool(attention_mask.all()):
        return None
    visible = attention_mask[:, None, None, :].bool().expand(-1, 1, query_length, -1)
    return torch.zeros(visible.shape, dtype=dtype, device=attention_mask.device).masked_fill(
        ~visible, torch.finfo(dtype).min
    )


class AdaFlashDrafter(AdaFlashPreTrainedModel):
    """Block-diffusion drafter: ``(noise_embeds, context_hidden_states) -> last_hidden_state``.

    The forward signature matches transformers' built-in DFlash generator
    (``generate(..., assistant_model=drafter, speculation_type="dflash")``) and adaflash-hf's engine.
    """

    def __init__(self, config: AdaFlashDrafterConfig):
        super().__init__(config)
        hidden = config.hidden_size
        self.layers = nn.ModuleList(AdaFlashDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = AdaFlashRMSNorm(hidden, eps=config.rms_norm_eps)
        self.fc = nn.Linear(len(config.target_layer_ids) * hidden, hidden, bias=False)
        self.hidden_norm = AdaFlashRMSNorm(hidden, eps=config.rms_norm_eps)
        self.rotary_emb = AdaFlashRotaryEmbedding(config)
        # The reduced draft vocabulary (target token ids), saved with the weights; None: all of it.
        if config.draft_vocab_size is not None:
            self.register_buffer("draft_vocab", torch.arange(config.draft_vocab_size), persistent=True)
        else:
            self.draft_vocab: torch.Tensor | None = None
        self.post_init()

    def set_draft_vocab(self, token_ids: torch.Tensor | list[int] | None) -> None:
        """Restrict drafting to ``token_ids`` (distinct target ids, e.g. the most frequent outputs); None: all."""
        if token_ids is None:
            if "draft_vocab" in self._buffers:
                del self._buffers["draft_vocab"]
            self.draft_vocab = None
            self.config.draft_vocab_size = None
            return
        ids = torch.as_tensor(token_ids, dtype=torch.long).flatten()
        if ids.numel() == 0 or ids.unique().numel() != ids.numel():
            raise ValueError("the draft vocabulary must be a non-empty list of distinct token ids.")
        if int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size:
            raise ValueError(f"draft vocabulary ids must lie in [0, vocab_size={self.config.vocab_size}).")
        if "draft_vocab" not in self._buffers:
            del self.draft_vocab
        self.register_buffer("draft_vocab", ids.to(self.fc.weight.device), persistent=True)
        self.config.draft_vocab_size = ids.numel()

    @classmethod
    def from_target(
        cls, target: PreTrainedModel, num_layers: int = 1, block_size: int = 16, **overrides
    ) -> AdaFlashDrafter:
        """A fresh, randomly initialised drafter sized for a loaded ``target``.

        Hidden size, attention shape, RoPE, vocabulary and special tokens come from the target; the
        mask token defaults to the last vocabulary row (unused padding rows in Qwen-style vocabularies);
        the context layers default to DFlash's choice for ``num_layers`` draft layers. Any config field
        can be overridden by keyword (e.g. ``mask_token_id=``, ``target_layer_ids=``, ``intermediate_size=``).
        """
        text = target.config.get_text_config()
        num_attention_heads = text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // num_attention_heads
        fields = dict(
            vocab_size=text.vocab_size,
            hidden_size=text.hidden_size,
            intermediate_size=text.intermediate_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_attention_heads,
            num_key_value_heads=getattr(text, "num_key_value_heads", None) or num_attention_heads,
            head_dim=head_dim,
            hidden_act=getattr(text, "hidden_act", "silu"),
            max_position_embeddings=text.max_position_embeddings,
            rms_norm_eps=getattr(text, "rms_norm_eps", 1e-6),
            rope_parameters=dict(text.rope_parameters or {"rope_type": "default", "rope_theta": 10000.0}),
            block_size=block_size,
            num_target_layers=text.num_hidden_layers,
            target_layer_ids=default_target_layer_ids(text.num_hidden_layers, num_layers),
            bos_token_id=text.bos_token_id,
            eos_token_id=text.eos_token_id,
            pad_token_id=text.pad_token_id,
        )
        fields.update(overrides)
        config = AdaFlashDrafterConfig(**fields)
        return cls(config).to(device=target.device, dtype=target.dtype)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """``PreTrainedModel.from_pretrained`` that refuses corrupt or incomplete drafter checkpoints.

        transformers would silently re-initialise missing weights; a drafter with random layers is
        lossless but useless, so a missing or mis-shaped weight is an error here.
        """
        wants_info = kwargs.pop("output_loading_info", False)
        try:
            model, info = super().from_pretrained(
                pretrained_model_name_or_path, *args, output_loading_info=True, **kwargs
            )
        except SafetensorError as error:
            raise OSError(
                f"The drafter weights in {pretrained_model_name_or_path} cannot be read ({error}): the file is corrupt "
                "or was only partly downloaded. Download or save the checkpoint again."
            ) from error
        broken = {k: sorted(v)[:8] for k, v in info.items() if k in ("missing_keys", "mismatched_keys") and v}
        if broken:
            raise ValueError(
                f"The drafter checkpoint in {pretrained_model_name_or_path} is incomplete or does not match its "
                f"config: "
                f"{broken}. Re-download it, or check that config.json belongs to these weights."
            )
        return (model, info) if wants_info else model

    @property
    def generation_config(self):
        # Reached only when transformers treats the drafter as an autoregressive assistant. A ValueError,
        # because an AttributeError would be swallowed by nn.Module.__getattr__'s generic message.
        raise ValueError(
            "AdaFlashDrafter proposes a whole block per forward pass and is not an autoregressive assistant. "
            "Call adaflash_hf.enable_adaflash(target) before target.generate(assistant_model=drafter), "
            "or pass speculation_type='dflash' to use transformers' built-in DFlash generator."
        )

    @generation_config.setter
    def generation_config(self, value) -> None:
        if value is not None:
            raise ValueError("AdaFlashDrafter has no generation config.")

    # Properties mirrored for transformers' DFlash generator, which reads them off the config.
    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def target_layer_ids(self) -> list[int]:
        return self.config.target_layer_ids

    @property
    def mask_token_id(self) -> int:
        return self.config.mask_token_id

    def project_context(self, context_hidden_states: torch.Tensor) -> torch.Tensor:
        """(B, T, n_layers * H) concatenated target hidden states -> (B, T, H) drafter context."""
        return self.hidden_norm(self.fc(context_hidden_states))

    def forward(
        self,
        noise_embeds: torch.Tensor,
        context_hidden_states: torch.Tensor,
        position_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        past_key_values: Cache | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        r"""
        noise_embeds (`(B, q, H)`): target input embeddings of ``[anchor, MASK, ...]`` (one or more blocks).
        context_hidden_states (`(B, c, n_layers * H)`): new target hidden states (context not yet cached).
        position_ids (`(B, c + q)`): absolute positions of the new context followed by the block.
        attention_mask (`(B, cached + c + q)` or 4-D `(B, 1, q, cached + c + q)`): 1 for visible keys.
        cache / past_key_values (`Cache`): drafter K/V of earlier context; the caller crops the block
            back off after each round. transformers 5.24 passes ``cache``, 5.23 ``past_key_values``.
        """
        cache = cache if cache is not None else past_key_values
        if use_cache and cache is None:
            cache = DynamicCache()
        context = self.project_context(context_hidden_states)
        num_context, num_query = context.shape[1], noise_embeds.shape[1]
        if position_ids is None:
            past = cache.get_seq_length() if cache is not None else 0
            position_ids = torch.arange(past, past + num_context + num_query, device=noise_embeds.device)[None]
        if position_ids.shape[-1] != num_context + num_query:
            raise ValueError(
                f"position_ids covers {position_ids.shape[-1]} positions but the drafter got {num_context} "
                f"context and {num_query} block positions: pass positions for both, context first."
            )
        mask = expand_attention_mask(attention_mask, num_query, noise_embeds.dtype, self.config._attn_implementation)

        hidden_states = noise_embeds
        position_embeddings = self.rotary_emb(hidden_states, position_ids)
        for layer in self.layers:
            hidden_states = layer(hidden_states, context, position_embeddings, mask, cache, **kwargs)
        return BaseModelOutputWithPast(last_hidden_state=self.norm(hidden_states))


AdaFlashDrafterConfig.register_for_auto_class()
AdaFlashDrafter.register_for_auto_class("AutoModel")
