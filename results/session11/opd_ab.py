"""Session 11 probe: serving throughput with inline OPD on and off, interleaved in one process (so drift hits both).
SmolLM2 bf16, 2 threads, batch 1, fiction train prompts, 64 new tokens; blocks of 10 requests alternate between
OPD off (no observer) and on (observer: recording + inline training under the duty cycle). The budget earned
while the off arm runs is dropped before each on block, so no block starts with a burst.

python results/session11/opd_ab.py [duty_cycle] [requests per arm]
"""
import sys
import time

import torch

from adaflash_hf import load_drafter, load_target
from adaflash_hf.cli_args import encode_prompt
from adaflash_hf.data import load_prompts
from adaflash_hf.decoding.engine import generate
from adaflash_hf.decoding.proposers import DraftingState
from adaflash_hf.online import AdaFlashOPD, OPDConfig

duty = float(sys.argv[1]) if len(sys.argv) > 1 else 0.15
per_arm = int(sys.argv[2]) if len(sys.argv) > 2 else 60
torch.set_num_threads(2)
target, tok = load_target("smollm2-135m", dtype="bf16")
drafter = load_drafter("auto", target, target_name="smollm2-135m")
prompts = [encode_prompt(tok, r["prompt"]) for r in load_prompts("fiction", split="train").to_list()[: 2 * per_arm + 2]]
opd = AdaFlashOPD(target, drafter, OPDConfig(duty_cycle=duty, lr=1e-3)).start()
state = DraftingState()
totals = {"off": [0, 0.0], "on": [0, 0.0]}


def serve(ids, observer):
    start = time.perf_counter()
    out = generate(target, drafter, ids, torch.ones_like(ids), max_new_tokens=64, do_sample=False,
                   pad_token_id=tok.pad_token_id, drafting_state=state, observer=observer)
    return out.num_new_tokens[0], time.perf_counter() - start


for ids in prompts[:2]:
    serve(ids, None)  # warm-up
for block in range(2 * per_arm // 10):
    arm = "on" if block % 2 else "off"
    if arm == "on":
        opd._credit, opd._tick = min(opd._credit, 0.0), time.perf_counter()
    for ids in prompts[2 + 10 * block: 12 + 10 * block]:
        n, s = serve(ids, opd.observer if arm == "on" else None)
        totals[arm][0] += n
        totals[arm][1] += s
opd.stop()
status = opd.status()
on, off = (totals[a][0] / totals[a][1] for a in ("on", "off"))
print(f"duty {duty}: OPD off {off:.1f} tok/s, on {on:.1f} tok/s, on/off {on / off:.2f}; trainer {status['train_seconds']:.1f} s "
      f"of {totals['on'][1]:.1f} s of on-time ({status['steps']} steps, {status['published']} published)")
