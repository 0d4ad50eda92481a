"""Session 17 probe: where a served round's time goes at c rows (no HTTP): proposing (drafter + look-ups + tree),
verifying (target forward + acceptance) and the rest, for speculative and plain rounds of one method.

python results/session17/round_split.py C METHOD   (METHOD: adaflash, adaflash@4, plain)
"""
import pathlib
import sys
import time
from collections import defaultdict

import torch

from adaflash_hf import load_drafter, load_target
from adaflash_hf.prompting import chat_prompt_ids
from adaflash_hf.serving.loadtest import ConcurrencyBenchArgs, bench_prompts, make_scheduler

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # results/: the probes' helpers
from probes import run_load  # noqa: E402

torch.set_num_threads(2)
target, tok = load_target("smollm2-135m", dtype="auto")
drafter = load_drafter("auto", target, target_name="smollm2-135m")
ids = [chat_prompt_ids(tok, p) for p in bench_prompts(ConcurrencyBenchArgs())]  # the bench's eval prompts, domains interleaved
c, method = int(sys.argv[1]), sys.argv[2]
s = make_scheduler(method, target, None if method == "plain" else drafter, tok, 32, "smollm2-135m")
batch = s.batch
live, last = {"on": False}, {}
sums = defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0, 0.0])  # (rows, speculative) -> rounds, wall, propose, verify, tokens, verified
step, on_round = batch.step, batch.on_round


gaps = []


def timed_step():
    start = time.perf_counter()
    if live["on"] and "end" in last and len(batch):
        gaps.append(start - last["end"])
    out = step()
    last["end"] = time.perf_counter()
    if live["on"] and "stats" in last:
        st = last.pop("stats")
        key = (len(st.rows), any(v > 1 for v in st.verify_lens))
        row = sums[key]
        row[0] += 1
        row[1] += time.perf_counter() - start
        row[2] += st.draft_time
        row[3] += st.verify_time
        row[4] += sum(st.accept_lengths) + len(st.rows)
        row[5] += sum(st.verify_lens)
    return out


def hook(stats):
    last["stats"] = stats
    if on_round is not None:
        on_round(stats)


batch.step, batch.on_round = timed_step, hook




run_load(s, ids[-4:], 2, 16)
run_load(s, ids[:c], c, 8)
live["on"] = True
run_load(s, ids[:max(16, 2 * c)], c, 64)
gaps.sort()
if gaps:
    print(f"between rounds (scheduler work, prefills included): median {gaps[len(gaps) // 2] * 1e3:.2f} ms, mean {sum(gaps) / len(gaps) * 1e3:.2f} ms")
print(f"{method} at c={c}: rows, speculative, rounds, ms per round (propose + verify + rest), tokens per row, verified per row")
for (rows, spec), (n, wall, prop, ver, toks, verified) in sorted(sums.items()):
    if n >= 3:
        print(f"{rows:3d} {'spec ' if spec else 'plain'} {n:4d}  {wall / n * 1e3:6.1f} = {prop / n * 1e3:5.1f} + {ver / n * 1e3:5.1f}"
              f" + {(wall - prop - ver) / n * 1e3:5.1f}   {toks / n / rows:.2f}  {verified / n / rows:.2f}")
