"""Session 18 probe: over HTTP (the concurrency bench itself), every round the adaptive policy's guard files, by kind:
plain steps, speculative rounds per verify-length cap, explored rounds of a held bucket. Where does the adaptive
server's time go at C rows, against `adaflash@4`'s?

python results/session18/guard_trace.py C [methods]
"""
import json
import sys
import time
from collections import defaultdict

from adaflash_hf.bench import BenchArgs
from adaflash_hf.decoding.policy import GoodputVerifyLength
from adaflash_hf.decoding.state import SpeculativeBatch
from adaflash_hf.serving.loadtest import run_concurrency_bench

trace = []
original = GoodputVerifyLength.update


def update(self, accept_lengths, verify_lens, seconds, proposed=None):
    used = self._used_cap
    trace.append({"policy": type(self).__name__, "rows": len(verify_lens), "proposed": proposed, "exploring": self._exploring,
                  "cap": None if used is None else used[1], "verified": int(verify_lens.sum()),
                  "tokens": int((accept_lengths + 1).sum()), "seconds": seconds,
                  "plain_step": self.cost_model.cost_batch(len(verify_lens), 1) if self.cost_model is not None else None})
    original(self, accept_lengths, verify_lens, seconds, proposed=proposed)


GoodputVerifyLength.update = update
engine_time = defaultdict(lambda: defaultdict(lambda: [0, 0.0]))  # method -> batch method -> [calls, seconds]


def timed(name):
    original_method = getattr(SpeculativeBatch, name)

    def wrapper(self, *args, **kwargs):
        start = time.perf_counter()
        out = original_method(self, *args, **kwargs)
        entry = engine_time[type(self.policy).__name__ + str(getattr(self.policy, "verify_len", "") or "")][name]
        entry[0] += 1
        entry[1] += time.perf_counter() - start
        return out

    setattr(SpeculativeBatch, name, wrapper)


for name in ("add_rows", "drop_rows", "step"):
    timed(name)
c = sys.argv[1]
methods = sys.argv[2] if len(sys.argv) > 2 else "adaflash"
run_concurrency_bench(BenchArgs(concurrency=c, methods=methods, max_new_tokens=64, num_threads=2, plot="", json="/tmp/guard_trace_bench.json").serving_args())
json.dump(trace, open(f"/tmp/guard_trace_{c}.json", "w"))
groups = defaultdict(lambda: [0, 0, 0, 0.0, 0])
for r in trace:
    if r["rows"] < int(c) // 2:
        continue
    kind = "plain" if not r["proposed"] else f"spec cap={r['cap']}" + (" explore" if r["exploring"] else "")
    g = groups[(r["policy"], kind)]
    g[0] += 1
    g[1] += r["tokens"]
    g[2] += r["verified"]
    g[3] += r["seconds"]
    g[4] += r["rows"]
print(f"rounds of >= {int(c) // 2} rows: policy, kind, rounds, ms per round, tokens per row, verified per row, tokens per second")
for (policy, kind), (n, toks, ver, secs, rows) in sorted(groups.items()):
    print(f"{policy:22} {kind:22} {n:5d} {secs / n * 1e3:7.1f} {toks / rows:5.2f} {ver / rows:5.2f} {toks / secs:7.1f}")
print("engine time per method (whole run, warm-ups included): calls and seconds of add_rows (prefills), drop_rows, step")
for method, parts in engine_time.items():
    print(f"{method:24} " + "  ".join(f"{name} {n} calls {secs:6.1f} s" for name, (n, secs) in parts.items()))
