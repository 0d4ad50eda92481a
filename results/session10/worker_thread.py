import time, torch, threading
from adaflash_hf import load_target
from adaflash_hf.data import load_prompts
torch.set_num_threads(2)
target, tok = load_target("smollm2-135m", dtype="bf16")
prompts = [r["prompt"] for r in load_prompts("code", split="eval").to_list()][:3]
ids = [tok.apply_chat_template([{"role":"user","content":p}], add_generation_prompt=True, return_dict=True)["input_ids"] for p in prompts]
def run(label):
    t = time.perf_counter(); n = 0
    for p in ids:
        x = torch.tensor([p]); o = target.generate(x, max_new_tokens=48, do_sample=False); n += o.shape[1] - x.shape[1]
    print(label, round(n / (time.perf_counter() - t), 1), "tok/s", flush=True)
run("main thread")
th = threading.Thread(target=run, args=("worker thread",)); th.start(); th.join()
run("main thread again")
