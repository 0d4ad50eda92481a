"""Write drafters in the published z-lab DFlash checkpoint layout (read by DFlash, vLLM and SGLang).

Weight names are shared between the two layouts; only ``config.json`` differs. Reading needs no
converter: ``AdaFlashDrafter.from_pretrained(dflash_folder)`` understands the DFlash config as is.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from .modeling_adaflash import AdaFlashDrafter


def dflash_problems(drafter: AdaFlashDrafter) -> list[str]:
    """What in ``drafter`` the DFlash layout cannot carry, one phrase each (empty: all of it can be written).

    DFlash readers (vLLM, SGLang, the reference code) build Qwen3 draft layers: queries and keys always
    normalised, a SiLU-gated MLP; LoRA layers injected for OPD would be written as weights they do not know.
    """
    config = drafter.config
    problems = []
    if not config.qk_norm:
        problems.append(
            "qk_norm=False: DFlash readers build Qwen3 layers, which always normalise queries and keys, so they "
            "would look for q_norm/k_norm weights this drafter does not have"
        )
    if config.hidden_act != "silu":
        problems.append(f"hidden_act={config.hidden_act!r}: DFlash readers build a SiLU-gated MLP")
    if any("lora_" in name for name in drafter.state_dict()):
        problems.append(
            "LoRA layers are injected (an OPD serving copy): merge the published adapter into the base drafter "
            "first (adaflash_hf.online.merge_adapter(base_drafter, adapter_dir), or adaflash export --adapter DIR)"
        )
    return problems


def save_dflash_checkpoint(drafter: AdaFlashDrafter, path: str | Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Save ``drafter`` as a DFlash-layout folder: ``config.json`` + ``model.safetensors``.

    A drafter the layout cannot carry (:func:`dflash_problems`) is refused with a ValueError naming why.
    """
    problems = dflash_problems(drafter)
    if problems:
        raise ValueError("This drafter cannot be written in the DFlash layout: " + "; ".join(problems) + ".")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = drafter.config.to_dflash_dict()
    config["dtype"] = str(dtype).removeprefix("torch.")
    # A reduced draft vocabulary is adaflash-hf's own addition: DFlash readers expect none.
    tensors = {
        name: t.detach().to(dtype).contiguous().cpu()
        for name, t in drafter.state_dict().items()
        if name != "draft_vocab"
    }
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return path
