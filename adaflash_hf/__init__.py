"""adaflash-hf: lossless speculative decoding for Hugging Face transformers with block-diffusion drafters.

Public API:
- ``AdaFlashDrafterConfig`` / ``AdaFlashDrafter``: the DFlash-architecture drafter (Hub-ready).
- ``enable_adaflash(target)``: ``target.generate(assistant_model=drafter)`` and pipelines use AdaFlash.
- ``AdaFlashCandidateGenerator``: the candidate generator transformers runs for an AdaFlash drafter.
- ``generate(target, drafter, input_ids, attention_mask=None, **generation_kwargs)``: batched engine.
- ``load_target(name_or_path, dtype=None, device=None)``: presets, local folders, GGUF files, Hub ids.
- ``load_drafter(name_or_path, target, target_name=None)``: bundled drafters, folders, Hub ids, fresh.
"""

from transformers import AutoConfig, AutoModel

from .configuration_adaflash import AdaFlashDrafterConfig
from .decoding.engine import generate
from .decoding.outputs import SpeculativeGenerateOutput, SpeculativeStats
from .decoding.policy import FixedVerifyLength, GoodputVerifyLength, VerifyLengthPolicy
from .decoding.proposers import DraftingConfig, DraftingState
from .drafters import load_drafter
from .integration import AdaFlashCandidateGenerator, enable_adaflash, last_generation_stats
from .modeling_adaflash import AdaFlashDrafter
from .targets import load_target

__all__ = [
    "AdaFlashCandidateGenerator",
    "AdaFlashDrafter",
    "AdaFlashDrafterConfig",
    "DraftingConfig",
    "DraftingState",
    "FixedVerifyLength",
    "GoodputVerifyLength",
    "SpeculativeGenerateOutput",
    "SpeculativeStats",
    "VerifyLengthPolicy",
    "enable_adaflash",
    "generate",
    "last_generation_stats",
    "load_drafter",
    "load_target",
]
__version__ = "0.1.0"

# Let AutoConfig/AutoModel resolve saved drafters without trust_remote_code once adaflash_hf is imported.
AutoConfig.register(AdaFlashDrafterConfig.model_type, AdaFlashDrafterConfig, exist_ok=True)
AutoModel.register(AdaFlashDrafterConfig, AdaFlashDrafter, exist_ok=True)
