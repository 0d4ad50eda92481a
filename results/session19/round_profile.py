"""Session 19 probe: where a served round's time goes at 16 rows (torch profiler), plain and adaflash@4.

python results/session19/round_profile.py [rows] [method ...]
"""
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from adaflash_hf import load_drafter, load_target
from adaflash_hf.decoding.state import RowSpec
from adaflash_hf.prompting import chat_prompt_ids
from adaflash_hf.serving.loadtest import ConcurrencyBenchArgs, bench_prompts, make_scheduler

torch.set_num_threads(2)
target, tok = load_target("smollm2-135m", dtype="auto")
drafter = load_drafter("auto", target, target_name="smollm2-135m")
rows = int(sys.argv[1]) if len(sys.argv) > 1 else 16
methods = sys.argv[2:] or ["plain", "adaflash@4"]
ids = [chat_prompt_ids(tok, p) for p in bench_prompts(ConcurrencyBenchArgs())][:rows]
for method in methods:
    s = make_scheduler(method, target, drafter, tok, 32, "smollm2-135m")
    batch = s.batch
    with torch.no_grad():
        batch.add_rows([RowSpec(i, p, 400) for i, p in enumerate(ids)])
        for _ in range(20):
            batch.step()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(10):
                batch.step()
    print(f"== {method}, {rows} rows, 10 rounds after 20")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))
