"""LoRA adapters on the drafter: attach, publish by version, load safely, swap in place, merge, push.

The serving drafter keeps its class (:class:`~adaflash_hf.AdaFlashDrafter`): LoRA layers are injected
into it in place (peft's ``inject_adapter_in_model``), so the engine and every check see the same
object. A new version reaches it only through :class:`AdapterSlot`: the trainer *offers* a state
dict from its own thread, and the engine thread *applies* it between rounds with peft's in-place
hotswap (``hotswap_adapter_from_state_dict``). No forward pass ever reads half-written weights.

Published versions live in ``publish_dir/v000N/`` (peft's ``adapter_model.safetensors`` and
``adapter_config.json``, plus ``metrics.json``), written to a temporary folder and renamed, then
``publish_dir/LATEST`` holds the newest version number (replaced atomically), so an external engine
can follow it with :class:`AdapterFollower`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

LATEST = "LATEST"
DEFAULT_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PEFT_PREFIX = "base_model.model."  # peft's key prefix in saved adapters


@dataclass
class LoraSettings:
    """The adapter's shape: rank, scaling and which drafter projections it adapts."""

    rank: int = field(default=16, metadata={"help": "LoRA rank."})
    alpha: float = field(default=32.0, metadata={"help": "LoRA alpha (scaling alpha / rank)."})
    target_modules: tuple[str, ...] = field(
        default=DEFAULT_TARGET_MODULES, metadata={"help": "Drafter linear layers that get an adapter."}
    )

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {self.rank}.")
        if not self.target_modules:
            raise ValueError("target_modules is empty: name at least one drafter projection (e.g. q_proj).")

    def peft_config(self):
        from peft import LoraConfig

        return LoraConfig(
            r=self.rank, lora_alpha=self.alpha, target_modules=list(self.target_modules), lora_dropout=0.0
        )


class AdapterError(ValueError):
    """A published adapter that cannot be used (missing, corrupt, incompatible or non-finite)."""


def attach_lora(drafter: torch.nn.Module, settings: LoraSettings) -> torch.nn.Module:
    """Inject a zero-initialised LoRA adapter ("default") into ``drafter`` in place; outputs are unchanged until a
    swap."""
    from peft import inject_adapter_in_model

    inject_adapter_in_model(settings.peft_config(), drafter)
    drafter.adaflash_lora = settings
    return drafter


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter weights of a drafter (injected or wrapped in a PeftModel), keyed as peft saves them, copied."""
    from peft import get_peft_model_state_dict

    state = get_peft_model_state_dict(model)
    return {(k if k.startswith(PEFT_PREFIX) else PEFT_PREFIX + k): v.detach().clone() for k, v in state.items()}


def check_adapter_state(state: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> None:
    """Raise :class:`AdapterError` unless ``state`` has the reference's keys and shapes and only finite values."""
    missing, extra = sorted(set(reference) - set(state)), sorted(set(state) - set(reference))
    if missing or extra:
        raise AdapterError(
            f"adapter keys do not match the drafter's LoRA layers (missing {missing[:3]}, unexpected {extra[:3]})."
        )
    for key, value in state.items():
        if value.shape != reference[key].shape:
            raise AdapterError(
                f"adapter tensor {key} has shape {tuple(value.shape)}, the drafter expects "
                f"{tuple(reference[key].shape)}."
            )
        if not bool(torch.isfinite(value).all()):
            raise AdapterError(f"adapter tensor {key} holds NaN or inf values.")


class AdapterSlot:
    """The serving drafter's adapter: versions are offered from any thread and applied on the engine thread.

    ``offer`` keeps only the newest offer; ``apply_pending`` (call it between rounds) copies it into
    the LoRA weights in place. ``version`` is what the engine is running.
    """

    def __init__(self, drafter: torch.nn.Module):
        if getattr(drafter, "adaflash_lora", None) is None:
            raise ValueError("the drafter has no LoRA adapter: call attach_lora(drafter, LoraSettings()) first.")
        self.drafter = drafter
        self.reference = adapter_state(drafter)
        self.version = 0
        self.swaps = 0
        self._pending: tuple[int, dict[str, torch.Tensor]] | None = None
        self._lock = threading.Lock()

    def offer(self, version: int, state: dict[str, torch.Tensor]) -> None:
        check_adapter_state(state, self.reference)
        with self._lock:
            self._pending = (version, state)

    def apply_pending(self) -> bool:
        """Swap in the newest offered adapter, if any; returns whether weights changed."""
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is None:
            return False
        from peft.utils.hotswap import hotswap_adapter_from_state_dict

        version, state = pending
        device = next(self.drafter.parameters()).device
        mapped = {_injected_key(k): v.to(device) for k, v in state.items()}
        with torch.no_grad():
            hotswap_adapter_from_state_dict(self.drafter, mapped, "default", self.drafter.adaflash_lora.peft_config())
        self.version, self.swaps = version, self.swaps + 1
        return True


def _injected_key(key: str) -> str:
    """peft's saved key (``base_model.model.x.lora_A.weight``) -> the injected parameter name
    (``x.lora_A.default.weight``)."""
    key = key.removeprefix(PEFT_PREFIX)
    return key.replace(".lora_A.weight", ".lora_A.default.weight").replace(".lora_B.weight", ".lora_B.default.weight")


# ------------------------------------------------------------------------------------------------
# Publishing and following versions
# ------------------------------------------------------------------------------------------------


def publish_adapter(
    publish_dir: str | Path,
    version: int,
    state: dict[str, torch.Tensor],
    settings: LoraSettings,
    base_drafter: str,
    metrics: dict | None = None,
    target: str | None = None,
) -> Path:
    """Write version ``version`` to ``publish_dir/v000N/`` atomically, then point ``LATEST`` at it.

    The folder is a peft adapter (``PeftModel.from_pretrained(drafter, folder)`` loads it) with a
    Hub model card (README.md) and ``metrics.json``.
    """
    from safetensors.torch import save_file

    from ..model_card import adapter_card

    publish_dir = Path(publish_dir)
    publish_dir.mkdir(parents=True, exist_ok=True)
    final = publish_dir / f"v{version:04d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".v{version:04d}-", dir=publish_dir))
    save_file({k: v.contiguous().cpu() for k, v in state.items()}, str(tmp / "adapter_model.safetensors"))
    config = settings.peft_config()
    config.base_model_name_or_path = base_drafter
    config.save_pretrained(str(tmp))  # adapter_config.json, as peft reads it
    (tmp / "metrics.json").write_text(json.dumps({"version": version, **(metrics or {})}, indent=2))
    adapter_card(base_drafter, target or "the drafter's target", version, metrics or {}).save(str(tmp / "README.md"))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _write_atomic(publish_dir / LATEST, f"{version}\n")
    return final


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def published_versions(publish_dir: str | Path) -> list[int]:
    return sorted(int(p.name[1:]) for p in Path(publish_dir).glob("v[0-9]*") if p.is_dir() and p.name[1:].isdigit())


def _adapter_file(adapter_dir: str | Path, name: str) -> Path:
    """``adapter_dir/name``; :class:`AdapterError` if it is missing."""
    path = Path(adapter_dir) / name
    if not path.is_file():
        raise AdapterError(f"no {name} in {adapter_dir}: not a published adapter folder.")
    return path


def load_adapter_state(adapter_dir: str | Path) -> dict[str, torch.Tensor]:
    """Read a published (or peft-saved) adapter folder; :class:`AdapterError` if it is missing or unreadable."""
    from safetensors.torch import load_file

    path = _adapter_file(adapter_dir, "adapter_model.safetensors")
    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types for truncated or garbled files
        raise AdapterError(f"{path} is corrupt or truncated ({exc}); keeping the previous adapter.") from exc


class AdapterFollower:
    """Follows a publish directory from another engine: ``poll()`` applies a newer valid version to a slot.

    A version that fails to load or check is skipped (and reported in ``errors``); the slot keeps the
    last good adapter.
    """

    def __init__(self, publish_dir: str | Path, slot: AdapterSlot):
        self.publish_dir, self.slot = Path(publish_dir), slot
        self.errors: list[str] = []

    def latest(self) -> int | None:
        try:
            return int((self.publish_dir / LATEST).read_text().strip())
        except (OSError, ValueError):
            return None

    def poll(self) -> bool:
        """Offer the newest valid published version newer than the slot's; returns whether one was offered."""
        latest = self.latest()
        if latest is None or latest <= self.slot.version:
            return False
        for version in sorted(
            (v for v in published_versions(self.publish_dir) if self.slot.version < v <= latest), reverse=True
        ):
            try:
                self.slot.offer(version, load_adapter_state(self.publish_dir / f"v{version:04d}"))
                return True
            except AdapterError as exc:
                self.errors.append(f"v{version}: {exc}")
                logger.warning("skipping adapter v%d: %s", version, exc)
        return False


# ------------------------------------------------------------------------------------------------
# Merging and sharing
# ------------------------------------------------------------------------------------------------


def merge_adapter(drafter, adapter_dir: str | Path):
    """A plain drafter with a published adapter merged into its weights (``drafter`` is not changed).

    ``drafter`` is a base :class:`AdaFlashDrafter` without injected LoRA layers; the result saves and
    loads like any drafter (``save_pretrained`` / ``from_pretrained``).
    """
    import copy

    from peft import PeftModel

    if getattr(drafter, "adaflash_lora", None) is not None:
        raise ValueError("merge_adapter needs the base drafter, not the serving copy with LoRA layers injected.")
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        _adapter_file(adapter_dir, name)
    model = PeftModel.from_pretrained(copy.deepcopy(drafter), str(adapter_dir))
    merged = model.merge_and_unload()
    if not all(math.isfinite(float(p.abs().max())) for p in merged.parameters()):
        raise AdapterError(f"merging {adapter_dir} gave non-finite weights.")
    return merged


def push_adapter_to_hub(
    adapter_dir: str | Path, repo_id: str, *, private: bool = False, token: str | None = None
) -> str:
    """Upload a published adapter folder (peft format, with its model card) to the Hub; returns the repo URL."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    url = api.create_repo(repo_id, private=private, exist_ok=True)
    api.upload_folder(
        repo_id=repo_id, folder_path=str(adapter_dir), commit_message=f"AdaFlash OPD adapter {Path(adapter_dir).name}"
    )
    return str(url)
