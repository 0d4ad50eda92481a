"""Keeping resident memory flat in processes that run for days: freed heap pages, oneDNN's primitive cache.

glibc keeps the pages of freed allocations below its ``mmap`` threshold (which it raises as large
blocks are freed) for reuse, and returns them only when the top of the heap is free. Decoding rows of
different lengths, recording trajectories and training on batches of different lengths all allocate
and free tensors of ever-changing sizes, so resident memory ratchets up although nothing leaks: a
1,000-request soak with OPD grew 1 GB after warm-up, and after 160 OPD steps alone one ``malloc_trim(0)``
gave back 950 MB (``docs/research-log.md``, 2026-12-03). The OPD trainer trims after each publication check, the
serving engine at most every :data:`TRIM_INTERVAL_S` seconds after a request finishes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import time

ONEDNN_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
ONEDNN_CACHE_CAPACITY = 256  # primitives; oneDNN's own default is 1,024 (docs/research-log.md, 2026-12-04)
TRIM_INTERVAL_S = 5.0  # a trim walks the free lists: ~20 ms on a fragmented 2 GB heap (docs/research-log.md)


def bound_onednn_primitive_cache(capacity: int = ONEDNN_CACHE_CAPACITY) -> int | None:
    """Cap oneDNN's primitive cache at ``capacity`` entries unless ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` is set.

    oneDNN (behind torch's bf16 matmuls and prepacked linear layers on a CPU) caches one primitive per input
    shape, up to 1,024 by default, and each holds its own buffers: a trainer that sees a new batch shape every
    step, or decoding rows of ever-changing lengths, fills it, and resident memory climbs by hundreds of MiB
    before it levels off. oneDNN reads the variable once, when it builds its first primitive, so this must run
    before any bf16 forward; ``import adaflash_hf`` calls it. Returns the capacity in force (the user's, if set;
    None where the user's value is no number, which is left for oneDNN to judge).
    """
    value = os.environ.setdefault(ONEDNN_CACHE_ENV, str(capacity))
    try:
        return int(value)
    except ValueError:
        return None


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None where the C library has none (macOS, musl)."""
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    except OSError:
        return None


def release_freed_heap() -> None:
    """Hand the heap pages that freed allocations left behind back to the OS (glibc ``malloc_trim(0)``; a
    no-op elsewhere). It walks the free lists: 0.02 ms on a small heap, about 20 ms on a fragmented 2 GB one,
    100-200 ms when it hands back 0.9 GB (``docs/research-log.md``, 2026-12-03)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


class HeapTrimmer:
    """Calls :func:`release_freed_heap` when asked, at most once every ``interval`` seconds."""

    def __init__(self, interval: float = TRIM_INTERVAL_S):
        self.interval = interval
        self.last = time.perf_counter()

    def maybe_trim(self) -> bool:
        now = time.perf_counter()
        if now - self.last < self.interval:
            return False
        release_freed_heap()
        self.last = time.perf_counter()
        return True
