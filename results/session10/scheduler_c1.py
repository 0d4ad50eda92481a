"""Session 10 probe: plain decoding at concurrency 1, transformers generate against the serving scheduler (no HTTP),
packed and stock kernels. OMP_WAIT_POLICY=PASSIVE python results/session10/scheduler_c1.py shows generate slowed to
the scheduler's speed.

python results/session10/scheduler_c1.py   (idle machine, 2 threads)
"""
import asyncio, time, torch, os
from adaflash_hf import load_target, load_drafter
from adaflash_hf.serving.loadtest import make_scheduler
from adaflash_hf.serving.scheduler import RequestParams
from adaflash_hf.data import load_prompts
from adaflash_hf.kernels import stock_linear
torch.set_num_threads(2)
target, tok = load_target("smollm2-135m", dtype="bf16")
prompts = [r["prompt"] for r in load_prompts("code", split="eval").to_list()][:6]
ids = [tok.apply_chat_template([{"role":"user","content":p}], add_generation_prompt=True, return_dict=True)["input_ids"] for p in prompts]
def serve(label):
    s = make_scheduler("plain", target, None, tok, 32, "smollm2-135m"); s.start()
    async def main():
        t = time.perf_counter(); n = 0
        for p in ids:
            out = await s.submit(p, RequestParams(max_new_tokens=64)).collect(); n += len(out[0])
        return n / (time.perf_counter() - t)
    print(label, "scheduler c=1", round(asyncio.run(main()), 1), "tok/s"); s.stop()
def direct(label):
    t = time.perf_counter(); n = 0
    for p in ids:
        x = torch.tensor([p]); o = target.generate(x, max_new_tokens=64, do_sample=False); n += o.shape[1] - x.shape[1]
    print(label, "generate", round(n / (time.perf_counter() - t), 1), "tok/s")
direct("packed"); serve("packed")
with stock_linear(target):
    direct("stock"); serve("stock")
