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


def save_dflash_checkpoint(drafter: AdaFlashDrafter, path: str | Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Save ``drafter`` as a DFlash-layout folder: ``config.json`` + ``model.safetensors``."""
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
