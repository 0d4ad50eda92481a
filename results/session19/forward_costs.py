"""Forward cost of SmolLM2 on this machine: prefills of one or more prompts against decode/verify steps at 16 rows.

python results/session19/forward_costs.py
"""
import statistics
import time

import torch
from transformers import DynamicCache

from adaflash_hf.targets import load_target

torch.set_num_threads(2)
model, tok = load_target("smollm2-135m", dtype="bf16")[:2]


def timed(fn, reps=7):
    fn()
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


@torch.no_grad()
def prefill(rows, length):
    ids = torch.randint(100, 10000, (rows, length))
    return timed(lambda: model(ids, use_cache=True))


@torch.no_grad()
def step(rows, context, k):
    ids = torch.randint(100, 10000, (rows, context))
    cache = DynamicCache()
    model(ids, past_key_values=cache, use_cache=True)
    new = torch.randint(100, 10000, (rows, k))

    def run():
        model(new, past_key_values=cache, use_cache=True)
        cache.crop(-k)

    return timed(run)


for rows, length in [(1, 166), (2, 166), (4, 166), (1, 20), (1, 146)]:
    print(f"prefill {rows} x {length}: {prefill(rows, length) * 1000:.1f} ms")
for rows in (1, 4, 16, 32):
    for k in (1, 2, 4, 8):
        print(f"step {rows} rows x {k} tokens (context 250): {step(rows, 250, k) * 1000:.1f} ms")
