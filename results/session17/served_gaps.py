"""Session 17 probe: over HTTP (the concurrency bench itself), how long the engine spends inside rounds and between
them, per method: if serving work (SSE events, the event loop, the client) lands between rounds, the guard, which
times rounds, does not see it.

python results/session17/served_gaps.py C [methods]
"""
import sys
import time
from collections import defaultdict

from adaflash_hf.bench import BenchArgs
from adaflash_hf.decoding.state import SpeculativeBatch
from adaflash_hf.serving.loadtest import run_concurrency_bench

stats = defaultdict(lambda: {"rounds": 0, "tokens": 0, "inside": 0.0, "gaps": []})
original = SpeculativeBatch.step


def step(self):
    start = time.perf_counter()
    out = original(self)
    end = time.perf_counter()
    s = stats[self.policy.__class__.__name__ + str(getattr(self.policy, "verify_len", ""))]
    last = getattr(self, "_probe_end", None)
    if last is not None and start - last < 0.5:  # between two rounds of a running batch (not an idle wait)
        s["gaps"].append(start - last)
    s["rounds"] += 1
    s["tokens"] += sum(len(u.tokens) for u in out)
    s["inside"] += end - start
    self._probe_end = end
    return out


SpeculativeBatch.step = step
c = sys.argv[1]
methods = sys.argv[2] if len(sys.argv) > 2 else "plain,adaflash@4,adaflash"
run_concurrency_bench(BenchArgs(concurrency=c, methods=methods, max_new_tokens=64, num_threads=2).serving_args())
for name, s in stats.items():
    gaps = sorted(s["gaps"])
    print(f"{name:24} rounds {s['rounds']:5d} tokens {s['tokens']:6d} inside rounds {s['inside'] * 1e3 / max(s['rounds'], 1):6.1f} ms/round, "
          f"between rounds median {gaps[len(gaps) // 2] * 1e3 if gaps else 0:.2f} ms, mean {sum(gaps) / max(len(gaps), 1) * 1e3:.2f} ms")
