"""Session 10 probe: the same target.generate in the main thread and in a worker thread (2-CPU machine).

python results/session10/worker_thread.py                       # main, worker, main
python results/session10/worker_thread.py main-never-parallel   # main kept at 1 thread from the start, worker at 2
"""
import sys, time, torch, threading
from adaflash_hf import load_target
from adaflash_hf.data import load_prompts
never = 'main-never-parallel' in sys.argv[1:]
torch.set_num_threads(1 if never else 2)  # main-never-parallel: the main thread never runs an OpenMP region with >1 thread
target, tok = load_target("smollm2-135m", dtype="bf16")
prompts = [r["prompt"] for r in load_prompts("code", split="eval").to_list()][:3]
ids = [tok.apply_chat_template([{"role":"user","content":p}], add_generation_prompt=True, return_dict=True)["input_ids"] for p in prompts]
def run(label):
    t = time.perf_counter(); n = 0
    for p in ids:
        x = torch.tensor([p]); o = target.generate(x, max_new_tokens=48, do_sample=False); n += o.shape[1] - x.shape[1]
    print(label, round(n / (time.perf_counter() - t), 1), "tok/s", flush=True)
def worker():
    torch.set_num_threads(2)
    run("worker thread")
if not never:
    run("main thread")
th = threading.Thread(target=worker); th.start(); th.join()
if not never:
    run("main thread again")
