"""Session 11 probe: what a plain step (no drafts) costs in the drafter-equipped batch against the plain batch,
16 rows, SmolLM2 bf16: the target forward with and without hidden-state capture, and the bookkeeping;
drafter+spec: after 12 speculative rounds of 9 tokens.

python results/session11/plain_step_overhead.py [rows]
"""
import sys, time, statistics, torch
from adaflash_hf import load_drafter, load_target
from adaflash_hf.data import load_prompts
from adaflash_hf.decoding.state import SpeculativeBatch, RowSpec
from adaflash_hf.decoding.policy import FixedVerifyLength
from adaflash_hf.decoding.proposers import DraftingConfig, DraftingState
torch.set_num_threads(2)
rows = int(sys.argv[1]) if len(sys.argv) > 1 else 16
target, tok = load_target("smollm2-135m", dtype=__import__("os").environ.get("DTYPE", "auto"))
drafter = load_drafter("auto", target, target_name="smollm2-135m")
prompts = [r["prompt"] for r in load_prompts("code", split="eval").to_list()][:rows]
ids = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, return_dict=True)["input_ids"] for p in prompts]
def batch(kind):
    if kind == "plain":
        d = DraftingConfig(drafter=False, global_index=False, datastore=False)
        return SpeculativeBatch(target, None, drafting=d, drafting_state=DraftingState(d), verify_policy=FixedVerifyLength(1))
    return SpeculativeBatch(target, drafter, drafting_state=DraftingState(), verify_policy=FixedVerifyLength(1))
def time_steps(kind, steps=24):
    b = batch(kind.split("+")[0])
    b.add_rows([RowSpec(i, p, 200) for i, p in enumerate(ids)])
    if kind.endswith("+spec"):  # speculative rounds first: holes in the cache, a drafter cache
        b.policy.verify_len = 9
        for _ in range(12):
            b.step()
        b.policy.verify_len = 1
    for _ in range(4):
        b.step()
    times = []
    for _ in range(steps):
        t = time.perf_counter(); b.step(); times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3
for rep in range(2):
    for kind in ("plain", "drafter", "drafter+spec"):
        print(f"{rows} rows, {kind:12s} batch, plain step: {time_steps(kind):.1f} ms", flush=True)
