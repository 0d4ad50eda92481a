"""Session 11 probe: plain decoding at concurrency 1 (no HTTP), transformers generate against the serving
scheduler with its engine in a background thread (start()) and in the main thread (run(), the client in
another thread, as `adaflash serve` and `adaflash bench --concurrency` now do).

python results/session11/served_thread.py   (idle machine, 2 threads)
"""
import asyncio, time, torch
from adaflash_hf import load_target
from adaflash_hf.serving.loadtest import make_scheduler, serve_while
from adaflash_hf.serving.scheduler import RequestParams
from adaflash_hf.data import load_prompts
torch.set_num_threads(2)
target, tok = load_target("smollm2-135m", dtype="bf16")
prompts = [r["prompt"] for r in load_prompts("code", split="eval").to_list()][:6]
ids = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, return_dict=True)["input_ids"] for p in prompts]
async def client(s):
    t = time.perf_counter(); n = 0
    for p in ids:
        out = await s.submit(p, RequestParams(max_new_tokens=64)).collect(); n += len(out[0])
    return n / (time.perf_counter() - t)
def background():
    s = make_scheduler("plain", target, None, tok, 32, "smollm2-135m"); s.start(); s.wait_until_running()
    print("scheduler c=1, engine in a background thread (start)", round(asyncio.run(client(s)), 1), "tok/s", flush=True); s.stop()
def main_thread():
    s = make_scheduler("plain", target, None, tok, 32, "smollm2-135m")
    print("scheduler c=1, engine in the main thread (run)     ", round(serve_while(s, client, s), 1), "tok/s", flush=True)
def direct():
    t = time.perf_counter(); n = 0
    for p in ids:
        x = torch.tensor([p]); o = target.generate(x, max_new_tokens=64, do_sample=False); n += o.shape[1] - x.shape[1]
    print("transformers generate, main thread                 ", round(n / (time.perf_counter() - t), 1), "tok/s", flush=True)
direct(); background(); main_thread(); direct(); main_thread(); background()
