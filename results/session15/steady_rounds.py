"""Session 15 probe: decode efficiency at a fixed batch size, no joins or prefills in the timed part. Each method's
batch takes the same `rows` prompts, runs `warm` rounds, then `timed` rounds are timed; methods interleaved, twice.
Reports tokens/s of the timed rounds, the share of speculative rounds, and tokens per row per round.

python results/session15/steady_rounds.py 16 plain,adaflash@1,adaflash@4,adaflash [warm] [timed]
A method name ending in ":stock" runs with transformers' DynamicLayer in the engine's cache (as before session 15).
"""
from transformers.cache_utils import Cache, DynamicLayer

from adaflash_hf._compat import GrowingLayer, RaggedCache
import os
import sys
import time

import torch

from adaflash_hf import load_drafter, load_target
from adaflash_hf.data import load_prompts
from adaflash_hf.decoding.state import RowSpec
from adaflash_hf.serving.loadtest import make_scheduler

torch.set_num_threads(2)
target, tok = load_target("smollm2-135m", dtype=os.environ.get("DTYPE", "auto"))
drafter = load_drafter("auto", target, target_name="smollm2-135m")
groups = [[r["prompt"] for r in load_prompts(d, split="eval").to_list()] for d in ("code", "math", "chat", "news")]
mixed = [g[i] for i in range(max(map(len, groups))) for g in groups if i < len(g)]
ids = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, return_dict=True)["input_ids"] for p in mixed]
rows, methods = int(sys.argv[1]), sys.argv[2].split(",")
warm = int(sys.argv[3]) if len(sys.argv) > 3 else 24
timed = int(sys.argv[4]) if len(sys.argv) > 4 else 40
schedulers = {m: make_scheduler(m.split(":")[0], target, drafter, tok, 32, "smollm2-135m") for m in methods}


def use_layer(layer):
    RaggedCache.__init__ = lambda self: Cache.__init__(self, layer_class_to_replicate=layer)


for s in schedulers.values():
    s.calibrate()
for rep in range(2):
    for method, s in schedulers.items():
        batch = s.batch
        use_layer(DynamicLayer if method.endswith(":stock") else GrowingLayer)
        spec = []
        inner = batch.on_round
        batch.on_round = lambda st: spec.append(max(st.verify_lens) > 1)
        batch.add_rows([RowSpec((rep, i), p, 1000, stop_ids=frozenset()) for i, p in enumerate(ids[rep * rows:(rep + 1) * rows])])
        for _ in range(warm):
            batch.step()
        spec.clear()
        tokens, start = 0, time.perf_counter()
        for _ in range(timed):
            tokens += sum(len(u.tokens) for u in batch.step())
        seconds = time.perf_counter() - start
        batch.drop_rows(list(batch.ids))
        batch.on_round = inner
        print(f"rep {rep} rows {rows} {method:16s} {tokens / seconds:6.1f} tok/s, {sum(spec) / len(spec):4.0%} speculative rounds, "
              f"{tokens / rows / timed:.2f} tokens per row per round, {seconds / timed * 1e3:.0f} ms per round", flush=True)
