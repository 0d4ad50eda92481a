"""On-line learning: trajectories recorded from live decoding, LoRA adapters, and the OPD pipeline.

``decoding/`` never imports this package: the engine calls an observer (``AdaFlashOPD.observer``).
"""

from .adapters import (
    AdapterFollower,
    AdapterSlot,
    LoraSettings,
    attach_lora,
    merge_adapter,
    publish_adapter,
    push_adapter_to_hub,
)
from .opd import AdaFlashOPD, OPDConfig
from .trajectories import Trajectory, TrajectoryBuffer, TrajectoryRecorder

__all__ = [
    "AdaFlashOPD", "AdapterFollower", "AdapterSlot", "LoraSettings", "OPDConfig", "Trajectory", "TrajectoryBuffer",
    "TrajectoryRecorder", "attach_lora", "merge_adapter", "publish_adapter", "push_adapter_to_hub",
]
