"""Session 7: target forward time with TRANSFORMERS_SDPA_FORCE_GQA off (0) and on (1), rows x cached slots x new tokens.
Usage: python results/session7/sdpa_gqa.py
"""
import os, time, torch
from transformers import DynamicCache
from adaflash_hf import load_target
torch.set_num_threads(2)
target, tok = load_target("smollm2-135m", dtype="bf16")
def bench(b, S, q, n=30):
    ids = torch.randint(0, 1000, (b, S))
    with torch.inference_mode():
        cache = DynamicCache(); target(input_ids=ids, past_key_values=cache, use_cache=True)
        x = torch.randint(0, 1000, (b, q)); mask = torch.ones(b, S + q, dtype=torch.long)
        pos = torch.arange(S, S + q).expand(b, -1)
        def one():
            target(input_ids=x, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True); cache.crop(-q)
        for _ in range(3): one()
        t = time.perf_counter()
        for _ in range(n): one()
        return (time.perf_counter() - t) / n * 1000
for b, S, q in [(1, 300, 9), (1, 300, 1), (4, 300, 9), (16, 350, 3), (16, 350, 9)]:
    r = {}
    for mode in ("0", "1", "0", "1"):
        os.environ["TRANSFORMERS_SDPA_FORCE_GQA"] = mode
        r.setdefault(mode, []).append(bench(b, S, q))
    print(b, S, q, {k: [round(x, 1) for x in v] for k, v in r.items()})
