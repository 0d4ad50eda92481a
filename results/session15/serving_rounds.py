"""Session 11 probe (session 15: DTYPE env, default auto) (engine in the main thread, as served now): what the adaptive server's rounds do under load (no HTTP): plain against speculative rounds,
tokens verified and accepted, time per round, realised tokens per second of each kind.

python results/session11/serving_rounds.py 16 adaflash [padded] [background]
    (concurrency, method; optional: ragged off; the engine in a background thread via start(), as session 10 ran it)
"""
import asyncio
import os
import statistics
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
prompts = [g[i] for i in range(max(map(len, groups))) for g in groups if i < len(g)][int(os.environ.get("OFFSET", "40")):]
ids = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, return_dict=True)["input_ids"] for p in prompts]
c, method = int(sys.argv[1]), sys.argv[2]
s = make_scheduler(method, target, drafter, tok, 32, "smollm2-135m")
if "padded" in sys.argv[3:]:
    s.batch.ragged = s.batch.policy.ragged = False
rounds = []
inner = s.batch.on_round


def record(stats):
    inner(stats)
    if hasattr(stats, "verify_lens"):
        rounds.append(stats)


s.batch.on_round = record


async def main():
    sem = asyncio.Semaphore(c)

    async def one(p):
        async with sem:
            return await s.submit(p, RequestParams(max_new_tokens=64)).collect()

    t = time.perf_counter()
    out = await asyncio.gather(*(one(p) for p in ids[: max(16, 2 * c)]))
    return out, time.perf_counter() - t

if "background" in sys.argv[3:]:
    s.start()
    out, sec = asyncio.run(main())
    s.stop()
else:
    out, sec = serve_while(s, main)
busy = sum(r.draft_time + r.verify_time for r in rounds)
print(f"c={c} {method}: {sum(len(o[0]) for o in out) / sec:.1f} tok/s over {sec:.1f} s, {len(rounds)} rounds, {busy:.1f} s of them in rounds' propose+verify, {s.batch.prefill_time:.1f} s in prefills")
for kind in ("plain", "spec"):
    group = [r for r in rounds if (max(r.verify_lens) > 1) == (kind == "spec") and len(r.rows) >= c // 2]
    if not group:
        continue
    rows = statistics.mean(len(r.rows) for r in group)
    verified = statistics.mean(sum(r.verify_lens) for r in group)
    accepted = statistics.mean(sum(r.accept_lengths) for r in group)
    ms = statistics.mean((r.draft_time + r.verify_time) * 1e3 for r in group)
    draft_ms = statistics.mean(r.draft_time * 1e3 for r in group)
    tokens = statistics.mean(sum(r.accept_lengths) + len(r.rows) for r in group)
    print(f"  {kind:5s} rounds {len(group):4d} (>= {c // 2} rows): rows {rows:.1f}, verified {verified:.1f}, accepted drafts {accepted:.2f}, "
          f"propose+verify {ms:.1f} ms (propose {draft_ms:.1f}), {tokens / ms * 1e3:.0f} tok/s in those rounds")
