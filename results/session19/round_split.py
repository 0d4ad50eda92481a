"""Session 19 probe: draft and verify time of served rounds at R rows, per method (no profiler overhead).

python results/session19/round_split.py [rows] [method ...]
"""
import pathlib
import statistics
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # results/: the probes' helpers
from probes import load_smollm2, served_batch  # noqa: E402

target, tok, drafter = load_smollm2()
rows = int(sys.argv[1]) if len(sys.argv) > 1 else 16
methods = sys.argv[2:] or ["plain", "adaflash@4", "adaflash@2"]
for method in methods:
    batch, stats = served_batch(method, rows, target, tok, drafter), []
    batch.on_round = stats.append
    with torch.no_grad():
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
