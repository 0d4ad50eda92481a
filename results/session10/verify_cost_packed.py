"""Median time of a target forward of k new tokens over a 256-token cache, packed against stock bf16 linear kernels.

python results/session10/verify_cost_packed.py [preset]   (session 10 probe; session 8's verify_cost.py with both kernels)
"""
import sys
import time

import torch
from transformers import DynamicCache

from adaflash_hf import load_target
from adaflash_hf.kernels import is_packed, stock_linear

torch.set_num_threads(2)
preset = sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m"
model, tok = load_target(preset, dtype="bf16")
assert is_packed(model), "packing did not measure faster on this CPU"
ids = torch.randint(100, 20000, (1, 256))
counts = (1, 2, 4, 8, 12, 16, 24, 32) if preset == "smollm2-135m" else (1, 4, 8, 16)


def run(k):
    c = DynamicCache()
    with torch.inference_mode():
        model(input_ids=ids, cache=c, use_cache=True)
        x = torch.randint(100, 20000, (1, k))
        pos = torch.arange(256, 256 + k)[None]
        m = torch.ones(1, 256 + k, dtype=torch.long)
        ts = []
        for _ in range(12 if preset == "smollm2-135m" else 5):
            t = time.perf_counter()
            model(input_ids=x, position_ids=pos, attention_mask=m, cache=c, use_cache=True, output_hidden_states=True)
            ts.append(time.perf_counter() - t)
            c.crop(-k)
    ts.sort()
    return ts[len(ts) // 2] * 1e3


for rep in range(2):  # interleaved, twice
    packed = {k: round(run(k), 1) for k in counts}
    with stock_linear(model):
        stock = {k: round(run(k), 1) for k in counts}
    print("packed", packed)
    print("stock ", stock)
    print("ratio ", {k: round(stock[k] / packed[k], 2) for k in counts})
