"""Configuration of the AdaFlash block-diffusion drafter (DFlash architecture).

This file ships to the Hub next to the weights (``trust_remote_code``), so it imports only
transformers. It also reads the published z-lab DFlash layout unchanged: there the drafter fields
live under ``dflash_config`` and ``model_type`` is ``qwen3``.
"""

from __future__ import annotations

from transformers import PretrainedConfig


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """DFlash's choice of target layers to read context from.

    One draft layer reads the middle layer; more read layers evenly spaced from 1 to
    ``num_target_layers - 3`` (36 target layers, 5 draft layers -> [1, 9, 17, 25, 33]).
    """
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    if end - start + 1 < num_draft_layers:  # shallow (test-sized) targets: spread over all layers
        start, end = 0, num_target_layers - 1
    span = end - start
    return sorted({start + round(i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)})


class AdaFlashDrafterConfig(PretrainedConfig):
    r"""
    Configuration of [`AdaFlashDrafter`]: a few transformer layers that denoise a block of mask tokens
    into draft tokens, conditioned on hidden states of the target model.

    The drafter shares the target's hidden size, vocabulary, RoPE and special tokens; it stores neither
    embeddings nor lm_head (the target's are used at run time).

    Args:
        vocab_size (`int`): The target's vocabulary size (rows of its embedding matrix).
        hidden_size (`int`): The target's hidden size (the drafter works in the same space).
        intermediate_size (`int`): Width of each draft layer's SwiGLU MLP.
        num_hidden_layers (`int`): Number of draft layers.
        num_attention_heads (`int`), num_key_value_heads (`int`), head_dim (`int`): Attention shape.
        hidden_act (`str`): MLP activation.
        max_position_embeddings (`int`): Longest absolute position the drafter is expected to see.
        rms_norm_eps (`float`): Epsilon of every RMSNorm.
        rope_parameters (`dict`): The target's RoPE parameters (`rope_type`, `rope_theta`, ...).
        attention_bias (`bool`): Whether q/k/v/o projections have biases.
        attention_dropout (`float`): Dropout on attention probabilities during training.
        qk_norm (`bool`): Qwen3-style RMSNorm on queries and keys (part of the DFlash checkpoints).
        block_size (`int`): Tokens per draft block: the anchor plus `block_size - 1` mask tokens.
        mask_token_id (`int`): Vocabulary row whose embedding fills the masked block positions.
        target_layer_ids (`list[int]`): 0-based target layers whose outputs form the context.
        num_target_layers (`int`): Number of layers of the target this drafter was built for.
        draft_vocab_size (`int`, *optional*): Size of the reduced draft vocabulary (FR-Spec, EAGLE-3):
            the drafter proposes only these target token ids, stored as the `draft_vocab` weight.
            `None` (DFlash checkpoints): the whole vocabulary.
    """

    model_type = "adaflash_drafter"
    keys_to_ignore_at_inference = ["past_key_values"]
    # Fields that fix the weights' shapes: a config.json without them would load as a mismatch of
    # every weight, so reading one is refused with their names instead.
    required_fields = (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "target_layer_ids",
    )

    def __init__(
        self,
        vocab_size: int = 32000,
        hidden_size: int = 1024,
        intermediate_size: int = 3072,
        num_hidden_layers: int = 1,
        num_attention_heads: int = 16,
        num_key_value_heads: int | None = None,
        head_dim: int | None = None,
        hidden_act: str = "silu",
        max_position_embeddings: int = 32768,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        rope_parameters: dict | None = None,
        attention_bias: bool = False,
        attention_dropout: float = 0.0,
        qk_norm: bool = True,
        block_size: int = 16,
        mask_token_id: int | None = None,
        target_layer_ids: list[int] | None = None,
        num_target_layers: int | None = None,
        draft_vocab_size: int | None = None,
        dflash_config: dict | None = None,
        **kwargs,
    ):
        # The z-lab DFlash layout nests the drafter fields; read them from there when present.
        if dflash_config:
            mask_token_id = dflash_config.get("mask_token_id", mask_token_id)
            target_layer_ids = dflash_config.get("target_layer_ids", target_layer_ids)
            block_size = dflash_config.get("block_size", block_size)
        for legacy_key in ("rope_theta", "rope_scaling"):
            legacy = kwargs.pop(legacy_key, None)
            if legacy is not None and rope_parameters is None:
                rope_parameters = (
                    {"rope_type": "default", "rope_theta": legacy} if legacy_key == "rope_theta" else dict(legacy)
                )
        kwargs.pop("model_type", None)  # a DFlash config says "qwen3"; this class is always adaflash_drafter
        for ignored in ("layer_types", "use_sliding_window", "sliding_window", "max_window_layers", "is_causal"):
            kwargs.pop(ignored, None)

        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.rope_parameters = dict(rope_parameters or {"rope_type": "default", "rope_theta": 10000.0})
        self.rope_parameters.setdefault("rope_type", self.rope_parameters.pop("type", "default"))
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.qk_norm = qk_norm
        self.block_size = block_size
        self.mask_token_id = vocab_size - 1 if mask_token_id is None else mask_token_id
        self.num_target_layers = num_target_layers
        self.draft_vocab_size = draft_vocab_size
        self.target_layer_ids = list(
            target_layer_ids
            if target_layer_ids is not None
            else default_target_layer_ids(num_target_layers or 2 * num_hidden_layers + 4, num_hidden_layers)
        )
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(**kwargs)
        self.validate_drafter_fields()

    @classmethod
    def get_config_dict(cls, pretrained_model_name_or_path, **kwargs) -> tuple[dict, dict]:
        """Read ``config.json``: an AdaFlash drafter's, or a z-lab DFlash one (``model_type: qwen3`` plus
        ``dflash_config``), which is this config in another layout, so it is read as such."""
        config_dict, kwargs = super().get_config_dict(pretrained_model_name_or_path, **kwargs)
        model_type = config_dict.get("model_type")
        dflash = config_dict.get("dflash_config") or {}
        if model_type not in (None, cls.model_type):
            if "dflash_config" not in config_dict:
                raise ValueError(
                    f"{pretrained_model_name_or_path} holds a `{model_type}` model, not a drafter: drafter configs "
                    f"have "
                    f"model_type `{cls.model_type}`, or a `dflash_config` section (the z-lab DFlash layout)."
                )
            config_dict = {**config_dict, "model_type": cls.model_type}  # DFlash layout: __init__ reads it as is
        missing = [
            name
            for name in cls.required_fields
            if name not in config_dict and name not in dflash and name not in kwargs
        ]
        if missing:
            raise ValueError(
                f"the drafter config in {pretrained_model_name_or_path} lacks {', '.join(missing)}: these fields fix "
                f"the "
                "shapes of the drafter's weights. Save the drafter again with save_pretrained, or add them to "
                "config.json."
            )
        return config_dict, kwargs

    def validate_drafter_fields(self) -> None:
        """Raise a ValueError naming the offending field when the drafter fields are inconsistent."""
        if self.block_size < 2:
            raise ValueError(
                f"block_size={self.block_size}: a draft block holds the anchor token plus at least one "
                "mask token, so block_size must be >= 2 (DFlash uses 16)."
            )
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(
                f"mask_token_id={self.mask_token_id} is outside the vocabulary [0, {self.vocab_size}). "
                "Pick an unused or reserved row of the target's embedding matrix."
            )
        if self.draft_vocab_size is not None and not 1 <= self.draft_vocab_size <= self.vocab_size:
            raise ValueError(
                f"draft_vocab_size={self.draft_vocab_size} must be in [1, vocab_size={self.vocab_size}], or None "
                "for the whole vocabulary."
            )
        if not self.target_layer_ids:
            raise ValueError("target_layer_ids is empty: the drafter needs at least one target layer as context.")
        if self.num_target_layers is not None:
            bad = [i for i in self.target_layer_ids if not 0 <= i < self.num_target_layers]
            if bad:
                raise ValueError(
                    f"target_layer_ids {bad} are out of range for a target with {self.num_target_layers} "
                    f"layers (valid: 0..{self.num_target_layers - 1})."
                )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}."
            )

    def to_dflash_dict(self) -> dict:
        """This config in the published z-lab DFlash layout (a Qwen3 text config plus DFlash fields)."""
        return {
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "attention_bias": self.attention_bias,
            "attention_dropout": self.attention_dropout,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "pad_token_id": self.pad_token_id,
            "head_dim": self.head_dim,
            "hidden_act": self.hidden_act,
            "hidden_size": self.hidden_size,
            "initializer_range": self.initializer_range,
            "intermediate_size": self.intermediate_size,
            "max_position_embeddings": self.max_position_embeddings,
            "num_attention_heads": self.num_attention_heads,
            "num_hidden_layers": self.num_hidden_layers,
            "num_key_value_heads": self.num_key_value_heads,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": dict(self.rope_parameters),
            "rope_theta": self.rope_parameters.get("rope_theta"),
            "tie_word_embeddings": False,
            "use_cache": True,
            "use_sliding_window": False,
            "vocab_size": self.vocab_size,
            "block_size": self.block_size,
            "num_target_layers": self.num_target_layers,
            "dflash_config": {"mask_token_id": self.mask_token_id, "target_layer_ids": list(self.target_layer_ids)},
            "dtype": str(self.dtype).removeprefix("torch.") if getattr(self, "dtype", None) is not None else "bfloat16",
        }
