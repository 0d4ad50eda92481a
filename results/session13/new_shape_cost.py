"""Session 13 probe: does a target forward with a token count not seen before cost more than a repeat?

Ragged verification gives every round its own total token count, so a forward's shape changes round by
round; if the CPU kernels (oneDNN primitives for the packed bf16 weights) are set up per shape, the first
rounds at each new total pay for it.

python results/session13/new_shape_cost.py [threads]
"""
import sys
import time

import torch
from transformers import DynamicCache

from adaflash_hf import load_target

torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
target, _ = load_target("smollm2-135m", dtype="bf16")
ids = torch.randint(100, 20000, (1, 128))


@torch.inference_mode()
def forward(n):
    cache = DynamicCache()
    target(input_ids=ids, past_key_values=cache, use_cache=True)
    step = torch.randint(100, 20000, (1, n))
    t = time.perf_counter()
    target(input_ids=step, past_key_values=cache, use_cache=True)
    return (time.perf_counter() - t) * 1e3


for n in (1, 2, 4, 8):  # warm the common shapes
    forward(n)
rows = []
for n in range(17, 61, 3):
    first, second, third = forward(n), forward(n), forward(n)
    rows.append((n, first, min(second, third)))
    print(f"{n:3d} new tokens: first {first:6.1f} ms, repeat {min(second, third):6.1f} ms", flush=True)
extra = sum(f - r for _, f, r in rows) / len(rows)
print(f"mean extra cost of a first forward at a new token count: {extra:.1f} ms")
