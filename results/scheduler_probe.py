"""Serving probe behind results/experiments.md (session 4): drive the Scheduler directly (no HTTP) and report
tok/s, tau, round counts, draft/verify seconds and the verify lengths chosen.

Usage: python results/scheduler_probe.py 8,16 plain,adaflash   (concurrency levels, methods)
"""
import asyncio, time, sys, torch
from adaflash_hf import load_target, load_drafter
from adaflash_hf.serving.loadtest import make_scheduler
from adaflash_hf.serving.scheduler import RequestParams
from adaflash_hf.data import load_prompts
target, tok = load_target("smollm2-135m", dtype="bf16")
drafter = load_drafter("auto", target, target_name="smollm2-135m")
prompts = []
for d in ("code","math","chat","news"):
    prompts += [r["prompt"] for r in load_prompts(d, split="eval").to_list()][:12]
ids = [tok.apply_chat_template([{"role":"user","content":p}], add_generation_prompt=True, return_dict=True)["input_ids"] for p in prompts]
for c in map(int, sys.argv[1].split(",")):
  for method in sys.argv[2].split(","):
    s = make_scheduler(method, target, drafter, tok, 32, "smollm2-135m"); s.start()
    T = {"draft":0.0,"verify":0.0,"rounds":0, "g":{}}
    orig = s.batch.on_round
    def on_round(r, orig=orig):
        T["draft"] += r.draft_time; T["verify"] += r.verify_time; T["rounds"] += 1
        g = max(r.verify_lens)-1; T["g"][g] = T["g"].get(g,0)+1
        orig(r)
    s.batch.on_round = on_round
    async def main():
        sem = asyncio.Semaphore(c)
        async def one(p):
            async with sem:
                return await s.submit(p, RequestParams(max_new_tokens=64)).collect()
        t = time.perf_counter()
        out = await asyncio.gather(*(one(p) for p in ids[: max(8, 2*c)]))
        return out, time.perf_counter() - t
    out, sec = asyncio.run(main())
    st = s.status(); s.stop()
    n = sum(len(o[0]) for o in out)
    spec = sum(1 for k in T["g"] if k)  # verify widths seen
    guard = getattr(s.batch.policy, "realised", {})
    print(f"c={c} {method:12s} {n/sec:6.1f} tok/s tau {st['mean_accepted_length']:.2f} verif/tok {st['verified_per_token']:.2f} rounds {T['rounds']} draft {T['draft']:.2f}s verify {T['verify']:.2f}s total {sec:.1f}s prefill {s.batch.prefill_time:.2f}s g {dict(sorted(T['g'].items()))} guard {({k: round(v[0] / v[1], 2) for k, v in guard.items()})}", flush=True)
