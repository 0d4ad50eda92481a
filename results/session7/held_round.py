"""Session 7: cost of a round without drafts (FixedVerifyLength(1)), 16 chat rows, with and without a drafter
in the batch (same slots). Usage: python results/session7/held_round.py [prof]   (prof: cProfile one run)
"""
import time, torch, cProfile, pstats, sys
from adaflash_hf import load_target, load_drafter
from adaflash_hf.decoding.state import SpeculativeBatch, RowSpec
from adaflash_hf.decoding.policy import FixedVerifyLength
from adaflash_hf.decoding.proposers import DraftingConfig, DraftingState
from adaflash_hf.data import load_prompts
torch.set_num_threads(2)
target, tok = load_target("smollm2-135m", dtype="bf16")
drafter = load_drafter("auto", target, target_name="smollm2-135m")
prompts = [r["prompt"] for r in load_prompts("chat", split="eval").to_list()][:16]
ids = [tok.apply_chat_template([{"role":"user","content":p}], add_generation_prompt=True, return_dict=True)["input_ids"] for p in prompts]
def run(use, n=40, prof=False):
    dc = DraftingConfig(drafter=use, global_index=False, datastore=False)
    B = SpeculativeBatch(target, drafter if use else None, drafting=dc, drafting_state=DraftingState(dc), verify_policy=FixedVerifyLength(1))
    B.add_rows([RowSpec(i, p, 200) for i, p in enumerate(ids)])
    for _ in range(5): B.step()
    t = time.perf_counter()
    if prof:
        pr = cProfile.Profile(); pr.enable()
    for _ in range(n): B.step()
    dt = (time.perf_counter() - t) / n
    if prof:
        pr.disable(); pstats.Stats(pr).sort_stats("tottime").print_stats(15)
    print("drafter" if use else "plain", f"{1000*dt:.1f} ms/round slots {B.num_slots}")
run(False); run(True); run(False); run(True)
if len(sys.argv) > 1: run(True, prof=True)
