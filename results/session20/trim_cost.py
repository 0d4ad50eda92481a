"""What one ``adaflash_hf.heap.release_freed_heap()`` (glibc ``malloc_trim(0)``) costs (session 20).

A small heap; then 30,000 tensors of 64 KiB (heap-allocated, 1.9 GB) with every other one freed: the first trim
hands back the freed 0.9 GB, the second finds nothing to hand back but still walks the fragmented free lists.

Usage: python results/session20/trim_cost.py
"""
import time

import torch

from adaflash_hf.heap import release_freed_heap
from adaflash_hf.online.soak import rss_mb


def timed_trim() -> float:
    start = time.perf_counter()
    release_freed_heap()
    return (time.perf_counter() - start) * 1e3


first_call = timed_trim()  # includes finding the C library (once per process)
print(f"small heap: first call {first_call:.2f} ms, then {timed_trim():.2f} ms")
tensors = [torch.ones(16_384) for _ in range(30_000)]
del tensors[::2]
before = rss_mb()
first = timed_trim()
print(f"fragmented heap, first trim: {first:.1f} ms, rss {before:.0f} -> {rss_mb():.0f} MiB")
print(f"fragmented heap, second trim: {timed_trim():.1f} ms")
