"""A target forward of k new tokens over a 256-token cache, fp32, stock kernels against packed, interleaved.

python results/session14/verify_cost_fp32.py [preset]   (session 14 probe)
Median ms over 5 interleaved passes of 4 forwards each; packing from adaflash_hf.kernels (load_target).
"""
import sys
import time

import torch
from transformers import DynamicCache

from adaflash_hf import load_target
from adaflash_hf.kernels import is_packed, stock_linear

torch.set_num_threads(2)
preset = sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m"
model, _ = load_target(preset, dtype="fp32")
assert is_packed(model), "fp32 packing did not measure faster here"
ids = torch.randint(100, 20000, (1, 256))
ks = (1, 2, 4, 8, 16, 32)
times = {(k, kind): [] for k in ks for kind in ("stock", "packed")}
with torch.inference_mode():
    cache = DynamicCache()
    model(input_ids=ids, cache=cache, use_cache=True)
    for _ in range(5):
        for k in ks:
            x = torch.randint(100, 20000, (1, k))
            pos = torch.arange(256, 256 + k)[None]
            mask = torch.ones(1, 256 + k, dtype=torch.long)
            for kind in ("stock", "packed"):
                for _ in range(4):
                    with stock_linear(model) if kind == "stock" else torch.inference_mode():
                        start = time.perf_counter()
                        model(input_ids=x, position_ids=pos, attention_mask=mask, cache=cache, use_cache=True, output_hidden_states=True)
                        times[k, kind].append(time.perf_counter() - start)
                    cache.crop(-k)
med = {key: sorted(v)[len(v) // 2] * 1e3 for key, v in times.items()}
print(f"{'tokens':>6} {'stock ms':>9} {'packed ms':>10} {'ratio':>6} {'stock/step':>11} {'packed/step':>12}")
for k in ks:
    print(f"{k:>6} {med[k, 'stock']:>9.1f} {med[k, 'packed']:>10.1f} {med[k, 'stock'] / med[k, 'packed']:>6.2f} "
          f"{med[k, 'stock'] / med[1, 'stock']:>11.2f} {med[k, 'packed'] / med[1, 'packed']:>12.2f}")
