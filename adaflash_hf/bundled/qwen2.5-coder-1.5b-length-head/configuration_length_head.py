"""Configuration of the AdaFlash adaptive length head.

This file ships to the Hub next to the head's weights (``trust_remote_code``), so it imports only
transformers.
"""

from __future__ import annotations

from transformers import PretrainedConfig


class AdaFlashLengthHeadConfig(PretrainedConfig):
    r"""
    Configuration of [`AdaFlashLengthHead`]: a small MLP over a drafter's final hidden states for one
    block and a prior estimate of each draft's acceptance that predicts, for every draft position
    k = 1..block_size-1, the conditional acceptance rate P(draft k accepted | drafts < k accepted).

    Args:
        hidden_size (`int`): The drafter's hidden size (width of the states the head reads).
        block_size (`int`): The drafter's block size: the anchor plus `block_size - 1` drafts.
        head_size (`int`): Width of the head's MLP (AdaFlash uses 256).
        layer_norm_eps (`float`): Epsilon of the input LayerNorm.
        drafter (`str`, *optional*): Name or path of the drafter the head was trained with (provenance).
    """

    model_type = "adaflash_length_head"

    def __init__(
        self,
        hidden_size: int = 1024,
        block_size: int = 16,
        head_size: int = 256,
        layer_norm_eps: float = 1e-5,
        drafter: str | None = None,
        **kwargs,
    ):
        self.hidden_size = hidden_size
        self.block_size = block_size
        self.head_size = head_size
        self.layer_norm_eps = layer_norm_eps
        self.drafter = drafter
        super().__init__(**kwargs)
        if block_size < 2:
            raise ValueError(
                f"block_size={block_size}: a block holds the anchor plus at least one draft, so it must be >= 2."
            )
        if hidden_size < 1 or head_size < 1:
            raise ValueError(f"hidden_size ({hidden_size}) and head_size ({head_size}) must be >= 1.")

    @property
    def num_drafts(self) -> int:
        """Draft positions per block (the head has one output per position)."""
        return self.block_size - 1
