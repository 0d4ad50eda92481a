"""Median time of a target forward of k new tokens over a 256-token cache (chain and 4-D tree mask).

python results/session8/verify_cost.py [preset] [dtypes]   (session 8 probe)
"""
import sys
import torch, time
from adaflash_hf import load_target
from adaflash_hf.decoding.tree import tree_attention_mask
from transformers import DynamicCache
torch.set_num_threads(2)
preset = sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m"
for dt in (sys.argv[2] if len(sys.argv) > 2 else "fp32,bf16").split(","):
    model, tok = load_target(preset, dtype=dt)
    ids = torch.randint(100, 20000, (1, 256))
    def run(k, tree=False):
        c = DynamicCache()
        with torch.inference_mode():
            model(input_ids=ids, cache=c, use_cache=True)
            x = torch.randint(100, 20000, (1, k))
            pos = torch.arange(256, 256 + k)[None]
            if tree:
                parents = torch.zeros(1, k - 1, dtype=torch.long)
                m = tree_attention_mask(torch.ones(1, 256, dtype=torch.long), parents, model.dtype)
            else:
                m = torch.ones(1, 256 + k, dtype=torch.long)
            ts = []
            for _ in range(12 if preset == "smollm2-135m" else 5):
                t = time.perf_counter()
                model(input_ids=x, position_ids=pos, attention_mask=m, cache=c, use_cache=True, output_hidden_states=True)
                ts.append(time.perf_counter() - t)
                c.crop(-k)
        ts.sort()
        return ts[len(ts) // 2] * 1e3
    print(dt, {k: round(run(k), 1) for k in ((1, 2, 4, 8, 12, 16, 24, 32) if preset == "smollm2-135m" else (1, 4, 8, 16))}, "tree16", round(run(16, True), 1))
