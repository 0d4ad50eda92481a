"""Session 15 probe: where the default engine's time goes at batch 1 (SmolLM2-135M, auto dtype, 2 threads): cProfile
of `adaflash_hf.generate` over two held-out code prompts of 96 tokens, after one unprofiled warm-up prompt.

python results/session15/profile_batch1.py
"""
import cProfile
import pstats
import time

import torch

from adaflash_hf import generate, load_drafter, load_target
from adaflash_hf.data import load_prompts
from adaflash_hf.decoding.proposers import DraftingState

torch.set_num_threads(2)
target, tok = load_target("smollm2-135m", dtype="auto")
drafter = load_drafter("auto", target, target_name="smollm2-135m")
prompts = [r["prompt"] for r in load_prompts("code", split="eval").to_list()][:3]
encoded = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, return_tensors="pt",
                                   return_dict=True) for p in prompts]
state = DraftingState()
generate(target, drafter, encoded[0]["input_ids"], encoded[0]["attention_mask"], max_new_tokens=96, drafting_state=state)
rounds, tokens = [], 0
profiler = cProfile.Profile()
start = time.perf_counter()
profiler.enable()
for e in encoded[1:]:
    out = generate(target, drafter, e["input_ids"], e["attention_mask"], max_new_tokens=96, drafting_state=state)
    rounds += out.stats.rounds
    tokens += sum(out.num_new_tokens)
profiler.disable()
seconds = time.perf_counter() - start
print(f"{tokens / seconds:.1f} tok/s, {len(rounds)} rounds, {seconds / len(rounds) * 1e3:.1f} ms per round "
      f"(prefills included); per round: drafter {sum(r.draft_time for r in rounds) / len(rounds) * 1e3:.1f} ms, "
      f"verification {sum(r.verify_time for r in rounds) / len(rounds) * 1e3:.1f} ms")
pstats.Stats(profiler).sort_stats("tottime").print_stats(8)
