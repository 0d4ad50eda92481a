"""Session 7: Scheduler (no HTTP) throughput, methods interleaved over reps, medians; eval prompts as the bench pools them.
Usage: python results/session7/scheduler_ab.py 16 plain,adaflash 3   (concurrency, methods[~guard margin], reps)
Session 8 added methods ending in "-chain" (e.g. adaflash-chain): the same server with draft trees off;
session 9 "-noscore": drafter scores off; session 10 "-padded": ragged verification off (rows padded to the longest).
"""
import asyncio, time, sys, os, torch, statistics
from adaflash_hf import load_target, load_drafter
from adaflash_hf.serving.loadtest import make_scheduler
from adaflash_hf.serving.scheduler import RequestParams
from adaflash_hf.data import load_prompts
torch.set_num_threads(2)
target, tok = load_target("smollm2-135m", dtype="bf16")
drafter = load_drafter("auto", target, target_name="smollm2-135m")
groups = [[r["prompt"] for r in load_prompts(d, split="eval").to_list()] for d in ("code","math","chat","news")]
prompts = [g[i] for i in range(max(map(len, groups))) for g in groups if i < len(g)][int(os.environ.get("OFFSET", "40")):]
ids = [tok.apply_chat_template([{"role":"user","content":p}], add_generation_prompt=True, return_dict=True)["input_ids"] for p in prompts]
c = int(sys.argv[1]); methods = sys.argv[2].split(","); reps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
res = {m: [] for m in methods}
for rep in range(reps):
    for method in (methods if rep % 2 == 0 else methods[::-1]):
        base, _, margin = method.partition("~")
        s = make_scheduler(base.removesuffix("-chain").removesuffix("-noscore").removesuffix("-padded"), target, drafter, tok, 32, "smollm2-135m")
        if base.endswith("-padded"): s.batch.ragged = s.batch.policy.ragged = False
        if base.endswith("-chain"): s.batch.proposer.trees = False
        if base.endswith("-noscore"): s.batch.proposer.config.drafter_scores = False
        if margin: s.batch.policy.margin = float(margin)
        s.start()
        async def main():
            sem = asyncio.Semaphore(c)
            async def one(p):
                async with sem:
                    return await s.submit(p, RequestParams(max_new_tokens=64)).collect()
            t = time.perf_counter()
            out = await asyncio.gather(*(one(p) for p in ids[: max(16, 2*c)]))
            return out, time.perf_counter() - t
        out, sec = asyncio.run(main()); s.stop()
        res[method].append(sum(len(o[0]) for o in out) / sec)
print(f"c={c}", {m: (round(statistics.median(v), 1), [round(x) for x in v]) for m, v in res.items()})
