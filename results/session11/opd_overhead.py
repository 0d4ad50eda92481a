"""Session 11 probe: what OPD costs serving besides its training time. SmolLM2 bf16, 2 threads, batch 1,
the same 8 fiction prompts (64 new tokens) each way, interleaved: plain engine, engine with a zero LoRA
adapter attached (no observer), and with the observer recording (OPD not started, so no training).

python results/session11/opd_overhead.py
"""
import time

import torch

from adaflash_hf import load_drafter, load_target
from adaflash_hf.cli_args import encode_prompt
from adaflash_hf.data import load_prompts
from adaflash_hf.decoding.engine import generate
from adaflash_hf.decoding.proposers import DraftingState
from adaflash_hf.online import AdaFlashOPD, OPDConfig

torch.set_num_threads(2)
target, tok = load_target("smollm2-135m", dtype="bf16")
drafter = load_drafter("auto", target, target_name="smollm2-135m")
prompts = [encode_prompt(tok, r["prompt"]) for r in load_prompts("fiction", split="train").to_list()[:8]]


def serve(observer=None):
    state, tokens, start = DraftingState(), 0, time.perf_counter()
    for ids in prompts:
        out = generate(target, drafter, ids, torch.ones_like(ids), max_new_tokens=64, do_sample=False,
                       pad_token_id=tok.pad_token_id, drafting_state=state, observer=observer)
        tokens += out.num_new_tokens[0]
    return tokens / (time.perf_counter() - start)


serve()
results = {"no OPD": [], "LoRA attached": [], "LoRA + recording": []}
for rep in range(2):
    results["no OPD"].append(serve())
    if rep == 0:
        opd = AdaFlashOPD(target, drafter, OPDConfig(buffer_trajectories=1000))  # attaches a zero LoRA; not started
    results["LoRA attached"].append(serve())
    results["LoRA + recording"].append(serve(opd.observer))
for name, values in results.items():
    print(f"{name:18s} " + "  ".join(f"{v:.1f}" for v in values) + " tok/s")
