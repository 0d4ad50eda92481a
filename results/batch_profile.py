"""cProfile of two waves of 16 rows through SpeculativeBatch (no scheduler, no HTTP), per method.

Usage: python results/batch_profile.py plain,adaflash   (results/experiments.md, session 4)
"""
import time, sys, torch, cProfile, pstats
from adaflash_hf import load_target, load_drafter
from adaflash_hf.serving.loadtest import make_scheduler
from adaflash_hf.decoding.state import RowSpec
from adaflash_hf.data import load_prompts
target, tok = load_target("smollm2-135m", dtype="bf16")
drafter = load_drafter("auto", target, target_name="smollm2-135m")
prompts = []
for d in ("code","math","chat","news"):
    prompts += [r["prompt"] for r in load_prompts(d, split="eval").to_list()][:8]
ids = [tok.apply_chat_template([{"role":"user","content":p}], add_generation_prompt=True, return_dict=True)["input_ids"] for p in prompts]
eos = frozenset([tok.eos_token_id])
for method in sys.argv[1].split(","):
    s = make_scheduler(method, target, drafter, tok, 16, "smollm2-135m"); s.start(); s.stop()
    b = s.batch
    def run():
        n = 0
        for wave in range(2):
            ups = b.add_rows([RowSpec(f"{wave}-{i}", p, 64, stop_ids=eos) for i, p in enumerate(ids[wave*16:(wave+1)*16])])
            while len(b): ups = b.step(); n += sum(len(u.tokens) for u in ups)
        return n
    run()  # warm
    t = time.perf_counter(); pr = cProfile.Profile(); pr.enable(); n = run(); pr.disable(); sec = time.perf_counter() - t
    print(method, f"{n/sec:.1f} tok/s {sec:.1f}s")
    st = pstats.Stats(pr); st.sort_stats("tottime").print_stats(12)
