"""Session 15 probe: a burst of joiners prefilled padded to the longest prompt against packed (ragged), SmolLM2-135M,
auto dtype, 2 threads, the bench's mixed eval prompts (42-373 tokens); median of 3 after a warm-up, interleaved.

python results/session15/prefill_ragged.py
"""
import statistics
import time

import torch

from adaflash_hf import load_drafter, load_target
from adaflash_hf.data import load_prompts
from adaflash_hf.decoding.proposers import DraftingState
from adaflash_hf.decoding.state import SpeculativeBatch

torch.set_num_threads(2)
target, tok = load_target("smollm2-135m", dtype="auto")
drafter = load_drafter("auto", target, target_name="smollm2-135m")
groups = [[r["prompt"] for r in load_prompts(d, split="eval").to_list()] for d in ("code", "math", "chat", "news")]
mixed = [g[i] for i in range(max(map(len, groups))) for g in groups if i < len(g)]
ids = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, return_dict=True)["input_ids"] for p in mixed]
print(f"SmolLM2-135M {target.dtype}, drafter features captured, 2 threads")
for rows in (2, 4, 16):
    prompts = ids[:rows]
    real, padded = sum(map(len, prompts)), rows * max(map(len, prompts))
    times = {False: [], True: []}
    for rep in range(4):
        for ragged in (False, True):
            batch = SpeculativeBatch(target, drafter, drafting_state=DraftingState())
            batch.ragged = ragged
            with torch.inference_mode():
                start = time.perf_counter()
                batch._prefill(prompts)
                if rep:
                    times[ragged].append(time.perf_counter() - start)
    pad, rag = statistics.median(times[False]), statistics.median(times[True])
    print(f"{rows:3d} prompts ({real} tokens, {padded} padded): padded {pad:6.2f} s, ragged {rag:6.2f} s ({pad / rag:.2f}x)", flush=True)
