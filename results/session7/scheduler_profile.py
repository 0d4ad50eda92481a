"""Session 7: one Scheduler run per method with per-round rows, slots, unread drafter context, verify time,
and a cProfile of the engine's state and proposer calls (eval prompts as the bench pools them, from the 41st; 2c requests).
Usage: python results/session7/scheduler_profile.py 32 adaflash,plain
"""
import asyncio, time, sys, torch, collections
from adaflash_hf import load_target, load_drafter
from adaflash_hf.serving.loadtest import make_scheduler
from adaflash_hf.serving.scheduler import RequestParams
from adaflash_hf.data import load_prompts
torch.set_num_threads(2)
target, tok = load_target("smollm2-135m", dtype="bf16")
drafter = load_drafter("auto", target, target_name="smollm2-135m")
groups = [[r["prompt"] for r in load_prompts(d, split="eval").to_list()] for d in ("code","math","chat","news")]
prompts = [g[i] for i in range(max(map(len, groups))) for g in groups if i < len(g)][40:]
ids = [tok.apply_chat_template([{"role":"user","content":p}], add_generation_prompt=True, return_dict=True)["input_ids"] for p in prompts]
c = int(sys.argv[1])
for method in sys.argv[2].split(","):
    s = make_scheduler(method, target, drafter, tok, 32, "smollm2-135m"); s.start()
    B = s.batch
    log = []
    import cProfile, pstats
    PR = cProfile.Profile()
    G = []
    V = []
    VV = []
    o_on = B.on_round
    def on_round(r, o_on=o_on):
        G.append(max(r.verify_lens)); V.append((r.draft_time, r.verify_time)); o_on(r)
    B.on_round = on_round
    orig_step = B.step
    def step():
        b = len(B.ids); slots = B.num_slots; pend = 0 if B.pending is None else max([sum(len(c[1]) for c in v) for v in B.pending.rows.values()] or [0])
        dc = B.draft_cache.get_seq_length() if B.use_drafter else -1
        PR.enable(); t = time.perf_counter(); r = orig_step(); dt = time.perf_counter() - t; PR.disable()
        log.append((b, slots, pend, dc, dt, G[-1] if G else -1, V[-1] if V else (0,0))); G.clear(); V.clear()
        return r
    B.step = step
    orig_add = B.add_rows
    comp = []
    orig_pack = B._pack
    def _pack(cache, mask, force, orig_pack=orig_pack):
        t = time.perf_counter(); r = orig_pack(cache, mask, force)
        if r is not mask: comp.append(time.perf_counter() - t)
        return r
    B._pack = _pack
    adds = []
    def add_rows(specs):
        t = time.perf_counter(); r = orig_add(specs); adds.append((len(specs), time.perf_counter() - t)); return r
    B.add_rows = add_rows
    async def main():
        sem = asyncio.Semaphore(c)
        async def one(p):
            async with sem:
                return await s.submit(p, RequestParams(max_new_tokens=64)).collect()
        t = time.perf_counter()
        out = await asyncio.gather(*(one(p) for p in ids[: max(16, 2*c)]))
        return out, time.perf_counter() - t
    out, sec = asyncio.run(main())
    s.stop()
    n = sum(len(o[0]) for o in out)
    full = [l for l in log if l[0] >= c - 2]
    pstats.Stats(PR).sort_stats("cumtime").print_stats("state.py|proposers.py|index|policy")
    print("compactions", len(comp), f"{sum(comp):.2f}s")
    print(f"{method}: {n/sec:.1f} tok/s, {len(log)} rounds, step total {sum(l[4] for l in log):.2f}s adds {len(adds)} {sum(a[1] for a in adds):.2f}s")
    if full:
        import statistics as st
        print("  rounds with >= c-2 rows:", len(full), "mean ms", 1000*st.mean(l[4] for l in full), "slots mean", st.mean(l[1] for l in full), "max", max(l[1] for l in full), "pending mean", st.mean(l[2] for l in full), "draftcache", st.mean(l[3] for l in full))
    for g in sorted(set(l[5] for l in full)):
        sel=[l for l in full if l[5]==g]; print(f"   g={g}: {len(sel)} rounds, mean {1000*st.mean(l[4] for l in sel):.0f}ms, draft {1000*st.mean(l[6][0] for l in sel):.1f} verify {1000*st.mean(l[6][1] for l in sel):.1f} slots {st.mean(l[1] for l in sel):.0f}")
    for l in log[::max(1, len(log)//12)]:
        print("   ", l[:4], f"{1000*l[4]:.0f}ms")
