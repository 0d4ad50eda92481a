"""Session 19 probe: draft and verify time of served rounds at R rows, per method (no profiler overhead).

python results/session19/round_split.py [rows] [method ...]
"""
import statistics
import sys
import time

import torch

from adaflash_hf import load_drafter, load_target
from adaflash_hf.decoding.state import RowSpec
from adaflash_hf.prompting import chat_prompt_ids
from adaflash_hf.serving.loadtest import ConcurrencyBenchArgs, bench_prompts, make_scheduler

torch.set_num_threads(2)
target, tok = load_target("smollm2-135m", dtype="auto")
drafter = load_drafter("auto", target, target_name="smollm2-135m")
rows = int(sys.argv[1]) if len(sys.argv) > 1 else 16
methods = sys.argv[2:] or ["plain", "adaflash@4", "adaflash@2"]
ids = [chat_prompt_ids(tok, p) for p in bench_prompts(ConcurrencyBenchArgs())][:rows]
for method in methods:
    s = make_scheduler(method, target, drafter, tok, 32, "smollm2-135m")
    batch, stats = s.batch, []
    batch.on_round = stats.append
    with torch.no_grad():
        batch.add_rows([RowSpec(i, p, 400) for i, p in enumerate(ids)])
        for _ in range(10):
            batch.step()
        stats.clear()
        walls = []
        for _ in range(20):
            t = time.perf_counter()
            batch.step()
            walls.append(time.perf_counter() - t)
    rounds = [r for r in stats if hasattr(r, "verify_time")]
    draft = statistics.median(r.draft_time for r in rounds) * 1e3
    verify = statistics.median(r.verify_time for r in rounds) * 1e3
    tokens = statistics.mean(sum(r.verify_lens) for r in rounds)
    acc = statistics.mean(sum(r.accept_lengths) / len(r.rows) + 1 for r in rounds)
    print(f"{method:12s} {rows} rows: wall {statistics.median(walls) * 1e3:6.1f} ms  draft {draft:6.1f}  verify {verify:6.1f}"
          f"  verified tokens {tokens:5.1f}  tokens/row/round {acc:.2f}", flush=True)
