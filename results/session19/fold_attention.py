"""Session 19 probe: one attention call of a grouped-query model, SDPA with enable_gqa against folded_sdpa, bf16, 2 threads.

python results/session19/fold_attention.py
"""
import statistics
import time

import torch
import torch.nn.functional as F

from adaflash_hf._compat import folded_sdpa

torch.set_num_threads(2)


class Module:
    is_causal = True

    def __init__(self, groups):
        self.num_key_value_groups = groups


def timed(fn, *args, reps=30, **kwargs):
    fn(*args, **kwargs)
    out = []
    for _ in range(reps):
        start = time.perf_counter()
        fn(*args, **kwargs)
        out.append(time.perf_counter() - start)
    return statistics.median(out) * 1e3


for heads, kv_heads, d in [(9, 3, 64), (12, 2, 128)]:  # SmolLM2-135M, Qwen2.5-1.5B
    for b, q, s in [(1, 1, 300), (1, 8, 300), (1, 16, 300), (1, 32, 300), (4, 8, 300), (16, 8, 300), (16, 16, 300),
                    (32, 1, 500), (32, 8, 500)]:
        query = torch.randn(b, heads, q, d, dtype=torch.bfloat16)
        key, value = (torch.randn(b, kv_heads, s, d, dtype=torch.bfloat16) for _ in range(2))
        mask = torch.ones(b, 1, q, s, dtype=torch.bool)
        mask[..., :10] = False
        gqa = timed(F.scaled_dot_product_attention, query, key, value, attn_mask=mask, enable_gqa=True)
        folded = timed(folded_sdpa, Module(heads // kv_heads), query, key, value, mask)
        print(f"heads {heads}/{kv_heads} d {d}  {b:2d} rows x {q:2d} queries over {s}: enable_gqa {gqa:.3f} ms  folded {folded:.3f} ms"
              f"  ratio {gqa / folded:.2f}")
