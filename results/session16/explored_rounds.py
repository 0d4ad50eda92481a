"""Session 16 probe: what the adaptive server's speculative rounds cost at one concurrency, and how much of it is the
drafter reading target features left unread while the guard held plain steps.

python results/session16/explored_rounds.py 8 [requests]
Per speculative round: rows, unread context tokens the drafter read, drafter seconds, verification seconds, the
round's tokens, and the plain step's measured cost at that many rows.
"""
import asyncio
import sys
import time

import torch

from adaflash_hf import load_drafter, load_target
from adaflash_hf.data import load_prompts
from adaflash_hf.decoding import state as state_module
from adaflash_hf.serving.loadtest import make_scheduler, serve_while
from adaflash_hf.serving.scheduler import RequestParams

torch.set_num_threads(2)
target, tok = load_target("smollm2-135m", dtype="auto")
drafter = load_drafter("auto", target, target_name="smollm2-135m")
groups = [[r["prompt"] for r in load_prompts(d, split="eval").to_list()] for d in ("code", "math", "chat", "news")]
mixed = [g[i] for i in range(max(map(len, groups))) for g in groups if i < len(g)]
ids = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, return_dict=True)["input_ids"] for p in mixed]
c = int(sys.argv[1])
count = int(sys.argv[2]) if len(sys.argv) > 2 else 2 * c
read = []
take = state_module.PendingContext.take


def counting_take(self, rows, size, like):
    hidden, pos, mask = take(self, rows, size, like)
    read.append((int(mask.sum()), tuple(mask.shape)))
    return hidden, pos, mask


state_module.PendingContext.take = counting_take


def run(s, prompts, conc, tokens, log=None):
    inner = s.batch.on_round

    def record(stats):
        inner(stats)
        if log is not None and max(stats.verify_lens) > 1:
            ctx = read[-1] if read else (0, ())
            plain = s.drafting_state.cost_model.cost_batch(len(stats.rows), 1)
            log.append((len(stats.rows), ctx, stats.draft_time, stats.verify_time, sum(stats.accept_lengths) + len(stats.rows), plain))
        read.clear()

    s.batch.on_round = record

    async def main():
        sem = asyncio.Semaphore(conc)

        async def one(p):
            async with sem:
                return await s.submit(p, RequestParams(max_new_tokens=tokens)).collect()

        t = time.perf_counter()
        out = await asyncio.gather(*(one(p) for p in prompts))
        return out, time.perf_counter() - t

    out, sec = serve_while(s, main)
    s.batch.on_round = inner
    return out, sec


s = make_scheduler("adaflash", target, drafter, tok, 32, "smollm2-135m")
run(s, ids[-4:], 2, 16)
run(s, ids[:c], c, 8)
s.drafting_state.forget_requests()
log = []
out, sec = run(s, ids[:count], c, 64, log)
n = sum(len(o[0]) for o in out)
print(f"c={c}: {n / sec:.1f} tok/s over {sec:.1f} s, {len(log)} speculative rounds")
for rows, ctx, d, v, tokens, plain in log:
    print(f"rows {rows:2d}  unread read {ctx[0]:5d} (padded {ctx[1]})  drafter {1e3 * d:6.1f} ms  verify {1e3 * v:6.1f} ms"
          f"  = {(d + v) / plain:5.2f} plain steps for {tokens / rows:.2f} tokens/row")
policy = s.batch.policy
print("guard realised (bucket, speculative) -> tokens/row per plain step:",
      {k: round(v[0] / v[1], 3) for k, v in policy.realised.items()})
print("caps:", {k: round(v[0] / v[1], 3) for k, v in policy.capped.items() if v[1] > 0}, "explore intervals:", policy._explore)
