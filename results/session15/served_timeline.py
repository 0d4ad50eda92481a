"""Session 15 probe: the served engine (no HTTP) at one concurrency, each method warmed up like the bench, then a
measured pass; per method: throughput, time in prefills, in plain and in speculative rounds, and the rate of each.

python results/session15/served_timeline.py 16 plain,adaflash@4,adaflash [requests]
"""
import asyncio
import os
import sys
import time

import torch

from adaflash_hf import load_drafter, load_target
from adaflash_hf.data import load_prompts
from adaflash_hf.serving.loadtest import make_scheduler, serve_while
from adaflash_hf.serving.scheduler import RequestParams

torch.set_num_threads(2)
target, tok = load_target("smollm2-135m", dtype=os.environ.get("DTYPE", "auto"))
drafter = load_drafter("auto", target, target_name="smollm2-135m")
groups = [[r["prompt"] for r in load_prompts(d, split="eval").to_list()] for d in ("code", "math", "chat", "news")]
mixed = [g[i] for i in range(max(map(len, groups))) for g in groups if i < len(g)]
ids = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, return_dict=True)["input_ids"] for p in mixed]
c, methods = int(sys.argv[1]), sys.argv[2].split(",")
count = int(sys.argv[3]) if len(sys.argv) > 3 else 2 * c
measured = ids[:count]
warm = ids[-4:]


def run(s, prompts, conc, tokens):
    rounds = []
    inner = s.batch.on_round

    def record(stats):
        inner(stats)
        rounds.append((time.perf_counter(), len(stats.rows), max(stats.verify_lens) > 1, stats.draft_time + stats.verify_time,
                       sum(stats.accept_lengths) + len(stats.rows)))

    s.batch.on_round = record

    async def main():
        sem = asyncio.Semaphore(conc)

        async def one(p):
            async with sem:
                return await s.submit(p, RequestParams(max_new_tokens=tokens)).collect()

        t = time.perf_counter()
        out = await asyncio.gather(*(one(p) for p in prompts))
        return out, time.perf_counter() - t

    prefill = s.batch.prefill_time
    out, sec = serve_while(s, main)
    s.batch.on_round = inner
    return out, sec, rounds, s.batch.prefill_time - prefill


for method in methods:
    s = make_scheduler(method, target, drafter, tok, 32, "smollm2-135m")
    run(s, warm, 2, 16)
    run(s, measured[:c], c, 8)
    s.drafting_state.forget_requests()
    out, sec, rounds, prefill = run(s, measured, c, 64)
    n = sum(len(o[0]) for o in out)
    line = f"c={c} {method:11s} {n / sec:6.1f} tok/s over {sec:5.1f} s: prefill {prefill:5.1f} s"
    for kind in (False, True):
        group = [r for r in rounds if r[2] == kind]
        if group:
            busy = sum(r[3] for r in group)
            line += (f" | {'spec' if kind else 'plain'} {len(group):3d} rounds, rows {sum(r[1] for r in group) / len(group):4.1f},"
                     f" {busy:5.1f} s, {sum(r[4] for r in group) / busy:5.1f} tok/s")
    other = sec - prefill - sum(r[3] for r in rounds)
    print(line + f" | other {other:4.1f} s", flush=True)
