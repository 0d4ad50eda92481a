"""Session 15 probe: a torch profile of 10 served rounds at a fixed batch size (SmolLM2-135M, auto dtype, 2 threads,
the bench's mixed eval prompts, 20 rounds warm-up and 20 timed first), with the engine's cache or, with "stock",
transformers' DynamicLayer in it (the cache before session 15).

python results/session15/profile_step.py plain 16 [stock]
"""
import sys
import time

import torch
from transformers.cache_utils import Cache, DynamicLayer

from adaflash_hf import load_drafter, load_target
from adaflash_hf._compat import RaggedCache
from adaflash_hf.data import load_prompts
from adaflash_hf.decoding.state import RowSpec
from adaflash_hf.serving.loadtest import make_scheduler

torch.set_num_threads(2)
method, rows = sys.argv[1], int(sys.argv[2])
if "stock" in sys.argv[3:]:
    RaggedCache.__init__ = lambda self: Cache.__init__(self, layer_class_to_replicate=DynamicLayer)
target, tok = load_target("smollm2-135m", dtype="auto")
drafter = load_drafter("auto", target, target_name="smollm2-135m")
groups = [[r["prompt"] for r in load_prompts(d, split="eval").to_list()] for d in ("code", "math", "chat", "news")]
mixed = [g[i] for i in range(max(map(len, groups))) for g in groups if i < len(g)]
ids = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, return_dict=True)["input_ids"] for p in mixed]
batch = make_scheduler(method, target, drafter, tok, 32, "smollm2-135m").batch
batch.add_rows([RowSpec(i, p, 1000, stop_ids=frozenset()) for i, p in enumerate(ids[:rows])])
for _ in range(20):
    batch.step()
start = time.perf_counter()
for _ in range(20):
    batch.step()
print(f"{method}, {rows} rows{' (stock DynamicLayer)' if 'stock' in sys.argv[3:] else ''}: "
      f"{(time.perf_counter() - start) / 20 * 1e3:.0f} ms per round, {batch.num_slots} cache slots")
with torch.profiler.profile() as profile:
    for _ in range(10):
        batch.step()
print(profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))
