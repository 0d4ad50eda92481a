"""Session 19 probe: transformers' own greedy generate at batch 1, stock attention against fold_gqa (interleaved).

python results/session19/plain_generate_fold.py
"""
import contextlib
import statistics
import time

import torch

from adaflash_hf import load_target
from adaflash_hf._compat import fold_gqa
from adaflash_hf.prompting import chat_prompt_ids

torch.set_num_threads(2)
target, tok = load_target("smollm2-135m", dtype="auto")
ids = torch.tensor([chat_prompt_ids(tok, "Write a short story about a lighthouse keeper.")])
outputs, times = {}, {"stock": [], "folded": []}
with torch.inference_mode():
    for _ in range(4):
        for mode in times:
            with fold_gqa(ids.device) if mode == "folded" else contextlib.nullcontext():
                start = time.perf_counter()
                out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=64, min_new_tokens=64,
                                      do_sample=False, pad_token_id=tok.pad_token_id)
                times[mode].append(time.perf_counter() - start)
            outputs[mode] = out[0, ids.shape[1]:].tolist()
stock, folded = (64 / statistics.median(v) for v in times.values())
print(f"transformers generate, batch 1, 64 tokens: stock {stock:.1f} tok/s, under fold_gqa {folded:.1f} tok/s ({folded / stock:.2f}x);"
      f" same tokens: {outputs['stock'] == outputs['folded']}")
