"""Finding a drafter for a target: bundled checkpoints, local folders, Hub ids, or a fresh one.

Bundled drafters (trained by adaflash-hf for the preset targets) ship inside the package under
``adaflash_hf/bundled/<preset>/`` as Hub-ready folders (config, bf16 safetensors, model card).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import PreTrainedModel

from .decoding.acceptance import PRIOR_FILE, load_acceptance_prior
from .decoding.datastore_file import DATASTORE_FILE, load_datastore
from .kernels import is_packed, pack_linear_weights
from .modeling_adaflash import AdaFlashDrafter
from .targets import HUB_ID

logger = logging.getLogger(__name__)
RETENTION_FILE = "retention.safetensors"  # prompts + the target's responses of the drafter's training domains (OPD)

BUNDLED_DIR = Path(__file__).parent / "bundled"
LENGTH_HEAD_SUFFIX = "-length-head"  # bundled/<preset>-length-head holds the preset's length head, not a drafter


def bundled_drafter_path(target_name: str) -> Path | None:
    """Folder of the drafter shipped for preset ``target_name``, or None if there is none."""
    folder = BUNDLED_DIR / target_name
    return folder if (folder / "config.json").is_file() else None


def load_drafter(
    name_or_path: str, target: PreTrainedModel, target_name: str | None = None, datastore: bool = True
) -> AdaFlashDrafter:
    """Resolve ``name_or_path`` to a drafter on the target's device and dtype.

    ``"auto"``: the bundled drafter for preset ``target_name``, else a fresh (untrained) one;
    ``"fresh"``: a randomly initialised drafter sized for ``target`` (lossless, but accepts little);
    anything else: a local folder (adaflash-hf or DFlash layout) or a Hub id ``owner/name``.
    With ``datastore`` (default), the folder's ``datastore.safetensors`` is indexed and attached as
    ``drafter.adaflash_datastore`` for the engine's ``datastore`` draft source; training skips it.
    Where the target's linear weights are packed for oneDNN (:mod:`adaflash_hf.kernels`), the drafter's are too.
    """
    if name_or_path == "auto":
        path = bundled_drafter_path(target_name) if target_name else None
        if path is None:
            logger.warning(
                "No bundled drafter for %r: using a fresh, untrained drafter (lossless, little speed-up).", target_name
            )
            name_or_path = "fresh"
        else:
            name_or_path = str(path)
    drafter = AdaFlashDrafter.from_target(target) if name_or_path == "fresh" else read_drafter(name_or_path, datastore)
    drafter = drafter.to(device=target.device, dtype=target.dtype).eval()
    if is_packed(target):  # the target's linear layers measured faster packed on this CPU: so are the drafter's
        pack_linear_weights(drafter, check_speed=False)
    return drafter


def read_drafter(name_or_path: str, datastore: bool = True, prior: bool = True, **kwargs) -> AdaFlashDrafter:
    """The drafter in a local folder or Hub repo, as saved, with the files beside its weights attached: the
    datastore (``drafter.adaflash_datastore``, unless not ``datastore``), the retention samples' path and the
    acceptance prior (unless not ``prior``). ``kwargs`` go to ``from_pretrained`` (e.g. ``dtype``)."""
    source = checked_drafter_source(name_or_path)
    try:
        drafter = AdaFlashDrafter.from_pretrained(source, **kwargs)
    except OSError as error:
        if Path(source).is_dir():
            raise
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise OSError(
            f"drafter {name_or_path!r} is no local folder, and loading it from the Hub failed: {reason}"
        ) from error
    path = drafter_file(source, DATASTORE_FILE) if datastore else None
    if path is not None:
        drafter.adaflash_datastore = load_datastore(path)
        logger.info(
            "datastore: %d tokens of the target's own outputs from %s", drafter.adaflash_datastore.num_tokens, path
        )
    path = drafter_file(source, RETENTION_FILE)
    if path is not None:  # read by OPD only (its retention check), so it is not opened here
        drafter.adaflash_retention_file = str(path)
    path = drafter_file(source, PRIOR_FILE) if prior else None
    if path is not None:
        drafter.adaflash_acceptance_prior = load_acceptance_prior(path)
    return drafter


def bundled_presets() -> list[str]:
    """The presets that ship a bundled drafter (named by their folders under ``bundled/``)."""
    return sorted(
        p.parent.name for p in BUNDLED_DIR.glob("*/config.json") if not p.parent.name.endswith(LENGTH_HEAD_SUFFIX)
    )


def checked_drafter_source(name_or_path: str) -> str:
    """A local drafter folder or a Hub id, checked so that a typo gets an error that says what is accepted."""
    bundled = ", ".join(bundled_presets()) or "none installed"
    accepted = (
        f"a drafter is 'auto' (the bundled drafter of a preset target: {bundled}), "
        "'fresh' (untrained, sized for the target), a local folder with config.json, or a Hub id (owner/name)"
    )
    return checkpoint_source(name_or_path, "drafter", accepted)


def checkpoint_source(name_or_path: str, what: str, accepted: str) -> str:
    """A local checkpoint folder or a Hub id; otherwise an error naming ``what`` and the ``accepted`` forms."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{what} folder {path} has no config.json: {accepted}.")
        return str(path)
    if path.exists():
        raise ValueError(f"{what} {name_or_path!r} is a file, not a folder: {accepted}.")
    if not HUB_ID.fullmatch(name_or_path) or name_or_path.startswith((".", "/", "~")):
        raise FileNotFoundError(f"no {what} folder {name_or_path}: {accepted}.")
    return name_or_path


def drafter_file(name_or_path: str, filename: str) -> Path | None:
    """A file that ships beside the drafter's weights (local folder or Hub repo), or None when there is none."""
    local = Path(name_or_path).expanduser()
    if local.is_dir():
        path = local / filename
        return path if path.is_file() else None
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    try:
        return Path(hf_hub_download(name_or_path, filename))
    except (EntryNotFoundError, LocalEntryNotFoundError):
        return None


def save_retention_samples(samples: Sequence[tuple[Sequence[int], int]], path) -> None:
    """Write ``(tokens, prompt_len)`` samples (a prompt and the target's response) as a drafter folder's
    ``retention.safetensors``: flat int32 ``ids``, ``lengths`` and ``starts`` (where each response begins)."""
    from safetensors.torch import save_file

    save_file(
        {
            "ids": torch.tensor([t for tokens, _ in samples for t in tokens], dtype=torch.int32),
            "lengths": torch.tensor([len(tokens) for tokens, _ in samples], dtype=torch.int64),
            "starts": torch.tensor([start for _, start in samples], dtype=torch.int64),
        },
        str(path),
    )


def load_retention_samples(path) -> list[tuple[list[int], int]]:
    """The ``(tokens, prompt_len)`` samples of a ``retention.safetensors`` file; a clear error when it is unusable."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(path))
        if {"ids", "lengths", "starts"} - tensors.keys() or int(tensors["lengths"].sum()) != tensors["ids"].numel():
            raise ValueError(
                "it needs flat 'ids', the 'lengths' of its samples (summing to its size) and their 'starts'"
            )
        samples = [
            (s.tolist(), int(start))
            for s, start in zip(
                torch.split(tensors["ids"].long(), tensors["lengths"].tolist()), tensors["starts"].tolist()
            )
        ]
        if any(not 1 <= start < len(tokens) for tokens, start in samples):
            raise ValueError("every sample needs a prompt and a response (0 < start < length)")
    except (SafetensorError, ValueError) as error:
        raise OSError(
            f"The retention samples {path} cannot be read ({error}): rebuild them (adaflash prepare-drafter) "
            "or delete the file (OPD then checks on the datastore's responses)."
        ) from error
    return samples
