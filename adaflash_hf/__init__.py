"""adaflash-hf: lossless speculative decoding for Hugging Face transformers with block-diffusion drafters.

Public API:
- ``AdaFlashDrafterConfig`` / ``AdaFlashDrafter``: the DFlash-architecture drafter (Hub-ready).
- ``enable_adaflash(target)``: ``target.generate(assistant_model=drafter)`` and pipelines use AdaFlash.
- ``AdaFlashCandidateGenerator``: the candidate generator transformers runs for an AdaFlash drafter.
- ``generate(target, drafter, input_ids, attention_mask=None, **generation_kwargs)``: batched engine.
- ``load_target(name_or_path, dtype=None, device=None)``: presets, local folders, GGUF files, Hub ids.
- ``pack_linear_weights(model)``: prepacked oneDNN weights for a bf16 or fp32 model on a CPU (the same
  outputs, faster forwards; ``load_target`` does it for you).
- ``load_drafter(name_or_path, target, target_name=None)``: bundled drafters, folders, Hub ids, fresh.
- ``AdaFlashLengthHead`` / ``load_length_head`` / ``LengthHeadVerifyLength``: the adaptive length head and
  the verify-length policy that reads it.

Names load on first use (PEP 562), so ``import adaflash_hf`` and the CLI's ``--help`` stay instant; the
first use of any of them also registers the drafter with ``AutoConfig``/``AutoModel``.
"""

import importlib

from .heap import bound_onednn_primitive_cache

bound_onednn_primitive_cache()  # before torch builds any oneDNN primitive (adaflash_hf.heap)

_EXPORTS = {
    "AdaFlashCandidateGenerator": ".integration",
    "AdaFlashDrafter": ".modeling_adaflash",
    "AdaFlashDrafterConfig": ".configuration_adaflash",
    "AdaFlashLengthHead": ".modeling_length_head",
    "AdaFlashLengthHeadConfig": ".configuration_length_head",
    "LengthHeadVerifyLength": ".decoding.policy",
    "DraftingConfig": ".decoding.config",
    "DraftingState": ".decoding.drafting_state",
    "FixedVerifyLength": ".decoding.policy",
    "GoodputVerifyLength": ".decoding.policy",
    "SpeculativeGenerateOutput": ".decoding.outputs",
    "SpeculativeStats": ".decoding.outputs",
    "VerifyLengthPolicy": ".decoding.policy",
    "enable_adaflash": ".integration",
    "generate": ".decoding.engine",
    "last_generation_stats": ".integration",
    "load_drafter": ".drafters",
    "load_length_head": ".training.length_head",
    "load_target": ".targets",
    "pack_linear_weights": ".kernels",
}
__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'adaflash_hf' has no attribute {name!r}")
    _register_auto_classes()
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value


def _register_auto_classes() -> None:
    """Let AutoConfig/AutoModel resolve saved drafters without trust_remote_code."""
    from transformers import AutoConfig, AutoModel

    from .configuration_adaflash import AdaFlashDrafterConfig
    from .modeling_adaflash import AdaFlashDrafter

    AutoConfig.register(AdaFlashDrafterConfig.model_type, AdaFlashDrafterConfig, exist_ok=True)
    AutoModel.register(AdaFlashDrafterConfig, AdaFlashDrafter, exist_ok=True)

    from .modeling_length_head import register as register_length_head

    register_length_head()
