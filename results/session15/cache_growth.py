"""Session 15 probe: what transformers' DynamicCache costs a decode step by concatenating at every update, against
the engine's RaggedCache (GrowingLayer: in-place writes into buffers with spare room). SmolLM2-135M, auto dtype,
2 threads; rows x 1-token steps after a `context`-token prefill; logits of both caches compared.

python results/session15/cache_growth.py [context]
"""
import statistics
import sys
import time

import torch
from transformers import DynamicCache

from adaflash_hf import load_target
from adaflash_hf._compat import CACHE_KWARG, RaggedCache

torch.set_num_threads(2)
target, _ = load_target("smollm2-135m", dtype="auto")
context = int(sys.argv[1]) if len(sys.argv) > 1 else 400
print(f"SmolLM2-135M {target.dtype}, {context}-token context, 2 threads")
for rows in (1, 4, 16, 32):
    ids = torch.randint(0, 49000, (rows, context), generator=torch.Generator().manual_seed(rows))
    result, logits = {}, {}
    for rep in range(4):
        for name, make in (("DynamicCache", DynamicCache), ("RaggedCache", RaggedCache)):
            with torch.inference_mode():
                cache = make()
                target(input_ids=ids, use_cache=True, **{CACHE_KWARG: cache})
                step = ids[:, -1:]
                times, outs = [], []
                for _ in range(16):
                    start = time.perf_counter()
                    out = target(input_ids=step, use_cache=True, **{CACHE_KWARG: cache}).logits
                    times.append(time.perf_counter() - start)
                    outs.append(out)
                    step = out[:, -1].argmax(-1, keepdim=True)
            result.setdefault(name, []).append(statistics.median(times[2:]) * 1e3)
            logits[name] = torch.cat(outs, 1)
    same = torch.equal(logits["DynamicCache"], logits["RaggedCache"])
    d, r = min(result["DynamicCache"]), min(result["RaggedCache"])
    print(f"{rows:3d} rows: DynamicCache {d:6.1f} ms, RaggedCache {r:6.1f} ms per step ({d / r:.2f}x); logits identical: {same}", flush=True)
