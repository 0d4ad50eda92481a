"""Session 19 probe: served rounds with and without folded GQA attention (interleaved blocks of rounds, same batch).

python results/session19/fold_ab.py [rows] [method ...]
"""
import contextlib
import statistics
import sys
import time

import torch

from adaflash_hf import load_drafter, load_target
from adaflash_hf.decoding import state as state_module
from adaflash_hf.decoding.state import RowSpec
from adaflash_hf.prompting import chat_prompt_ids
from adaflash_hf.serving.loadtest import ConcurrencyBenchArgs, bench_prompts, make_scheduler

torch.set_num_threads(2)
target, tok = load_target("smollm2-135m", dtype="auto")
drafter = load_drafter("auto", target, target_name="smollm2-135m")
rows = int(sys.argv[1]) if len(sys.argv) > 1 else 16
methods = sys.argv[2:] or ["plain", "adaflash@4", "adaflash@2"]
ids = [chat_prompt_ids(tok, p) for p in bench_prompts(ConcurrencyBenchArgs())][:rows]
fold = state_module.fold_gqa


def off(device):
    return contextlib.nullcontext()


for method in methods:
    s = make_scheduler(method, target, drafter, tok, 32, "smollm2-135m")
    batch = s.batch
    times = {"stock": [], "folded": []}
    with torch.no_grad():
        batch.add_rows([RowSpec(i, p, 1000) for i, p in enumerate(ids)])
        for _ in range(5):
            batch.step()
        for _ in range(4):
            for mode in times:
                state_module.fold_gqa = fold if mode == "folded" else off
                for _ in range(6):
                    t = time.perf_counter()
                    batch.step()
                    times[mode].append(time.perf_counter() - t)
    state_module.fold_gqa = fold
    stock, folded = (statistics.median(v) * 1e3 for v in times.values())
    print(f"{method:12s} {rows:2d} rows: stock {stock:6.1f} ms  folded {folded:6.1f} ms  ratio {stock / folded:.2f}", flush=True)
