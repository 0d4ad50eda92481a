"""Session 16 probe: the prompt tokens each method's scheduler admits between two rounds (adaptive admission), from
its own start-up cost profile, at several batch sizes.

python results/session16/admission_budget.py
"""
import torch

from adaflash_hf import load_drafter, load_target
from adaflash_hf.serving.loadtest import make_scheduler

torch.set_num_threads(2)
target, tok = load_target("smollm2-135m", dtype="auto")
drafter = load_drafter("auto", target, target_name="smollm2-135m")
for method in ("plain", "adaflash"):
    s = make_scheduler(method, target, drafter, tok, 32, "smollm2-135m")
    s.calibrate()
    cost = s.drafting_state.cost_model
    print(method, "measured token counts:", sorted(cost.seconds))
    print(method, "cost ms of n tokens:", {n: round(1e3 * cost.cost(n), 1) for n in (64, 128, 256, 384, 512, 1024)})
    for active in (4, 8, 16, 32):
        s._active = {i: None for i in range(active)}
        print(f"{method} active {active}: plain step {1e3 * cost.cost_batch(active, 1):.1f} ms, budget {s._prefill_budget()} tokens")
