"""The datastore file shipped beside a drafter (``datastore.safetensors``): the target's own responses to
training prompts as token streams, read into an :class:`~.ngram_index.NGramIndex`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from .ngram_index import NGramIndex

DATASTORE_FILE = "datastore.safetensors"


def load_datastore(path: str | Path, max_n: int = 4) -> NGramIndex:
    """An :class:`NGramIndex` over the token streams of a ``datastore.safetensors`` file (``tokens``, ``lengths``)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(path))
        if {"tokens", "lengths"} - tensors.keys() or int(tensors["lengths"].sum()) != tensors["tokens"].numel():
            raise ValueError("it needs a flat 'tokens' tensor and the 'lengths' of its streams, summing to its size")
    except (SafetensorError, ValueError) as error:
        raise OSError(
            f"The datastore {path} cannot be read ({error}): download or build it again "
            "(adaflash prepare-drafter), or delete it to draft without one."
        ) from error
    index = NGramIndex(max_n)
    for stream in torch.split(tensors["tokens"].long(), tensors["lengths"].tolist()):
        index.start_stream(stream.tolist())
    index.source_path = str(path)  # where its streams can be read again (OPD's retention check)
    return index


def save_datastore(streams: Sequence[Sequence[int]], path: str | Path) -> None:
    """Write token streams as a ``datastore.safetensors`` (a flat ``tokens`` tensor and the streams' ``lengths``)."""
    from safetensors.torch import save_file

    save_file(
        {
            "tokens": torch.tensor([t for s in streams for t in s], dtype=torch.int32),
            "lengths": torch.tensor([len(s) for s in streams], dtype=torch.int64),
        },
        str(path),
    )
