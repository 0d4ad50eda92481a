"""On-line learning: trajectories recorded from live decoding, LoRA adapters, and the OPD pipeline.

``decoding/`` never imports this package: the engine calls an observer (``AdaFlashOPD.observer``).
Names load on first use (PEP 562), so ``adaflash bench-opd --help`` and ``adaflash soak-opd --help``
import no torch.
"""

import importlib

_EXPORTS = {
    "AdaFlashOPD": ".opd",
    "AdapterFollower": ".adapters",
    "AdapterSlot": ".adapters",
    "LoraSettings": ".adapters",
    "OPDConfig": ".configs",
    "Trajectory": ".trajectories",
    "TrajectoryBuffer": ".trajectories",
    "TrajectoryRecorder": ".trajectories",
    "attach_lora": ".adapters",
    "datastore_sequences": ".trajectories",
    "load_retention_samples": "..drafters",
    "retention_samples": ".trajectories",
    "save_retention_samples": "..drafters",
    "merge_adapter": ".adapters",
    "publish_adapter": ".adapters",
    "push_adapter_to_hub": ".adapters",
    "teacher_forced_trajectory": ".trajectories",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'adaflash_hf.online' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value
