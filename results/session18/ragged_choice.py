"""Session 18 probe: why the adaptive policy verifies so few drafts at 4 rows. For every speculative round of
>= 2 rows it records the rates the policy saw (the length head's included), the verify lengths it chose, the
ragged cost table it chose them against, and what the round then accepted.

python results/session18/ragged_choice.py C
"""
import json
import pathlib
import sys

import torch

from adaflash_hf import load_drafter, load_target
from adaflash_hf.decoding import policy as policy_module
from adaflash_hf.prompting import chat_prompt_ids
from adaflash_hf.serving.loadtest import ConcurrencyBenchArgs, bench_prompts, make_scheduler

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # results/: the probes' helpers
from probes import run_load  # noqa: E402

torch.set_num_threads(2)
target, tok = load_target("smollm2-135m", dtype="auto")
drafter = load_drafter("auto", target, target_name="smollm2-135m")
ids = [chat_prompt_ids(tok, p) for p in bench_prompts(ConcurrencyBenchArgs())]
c = int(sys.argv[1])
method = sys.argv[2] if len(sys.argv) > 2 else "adaflash"
s = make_scheduler(method, target, drafter, tok, 32, "smollm2-135m")
pol = s.batch.policy
records, live = [], {"on": False}
original_ragged = policy_module.ragged_verify_lens


def ragged(rates, cost_model, max_verify_len=None):
    lens = original_ragged(rates, cost_model, max_verify_len)
    if live["on"]:
        b = rates.shape[0]
        table = dict(sorted(cost_model.ragged_seconds.get(b, {}).items()))
        records.append({"rows": b, "limit": max_verify_len, "rates": rates.float().cpu().tolist(), "lens": lens.tolist(),
                        "table": {int(k): v for k, v in table.items()}, "plain": cost_model.cost_batch(b, 1)})
    return lens


policy_module.ragged_verify_lens = ragged
original_update = type(pol).update


def update(self, accept_lengths, verify_lens, seconds, proposed=None):
    if live["on"] and records and "accepted" not in records[-1] and len(verify_lens) == records[-1]["rows"]:
        records[-1]["accepted"] = accept_lengths.tolist()
        records[-1]["seconds"] = seconds
    original_update(self, accept_lengths, verify_lens, seconds, proposed=proposed)


type(pol).update = update
from collections import Counter  # noqa: E402

rounds = Counter()
drafter_runs = {"rounds": 0, "drafter": 0}
propose = s.batch.proposer.propose


def counted_propose(row_ids, run_drafter, **kwargs):
    ran = {"yes": False}

    def wrapped():
        ran["yes"] = True
        return run_drafter()

    out = propose(row_ids, None if run_drafter is None else wrapped, **kwargs)
    if live["on"] and len(row_ids) >= 2:
        drafter_runs["rounds"] += 1
        drafter_runs["drafter"] += ran["yes"]
    return out


s.batch.proposer.propose = counted_propose
hook = s.batch.on_round


def on_round(stats):
    if live["on"] and len(stats.rows) >= 2:
        for source, length, accepted in zip(stats.sources, stats.verify_lens, stats.accept_lengths):
            rounds[(source, "verified")] += length
            rounds[(source, "accepted")] += accepted
            rounds[(source, "rows")] += 1
    if hook is not None:
        hook(stats)


s.batch.on_round = on_round
forwards = []  # every ragged forward the cost model is fed: (rows, new tokens, seconds)
cost_update = s.drafting_state.cost_model.update


def logged_update(num_tokens, seconds, rows=1, ragged=False):
    if live["on"] and ragged:
        forwards.append((rows, num_tokens, seconds))
    cost_update(num_tokens, seconds, rows=rows, ragged=ragged)


s.drafting_state.cost_model.update = logged_update




run_load(s, ids[-4:], 2, 16)
run_load(s, ids[:c], c, 16)
live["on"] = True
run_load(s, ids[: max(16, 2 * c)], c, 64)
json.dump(records, open(f"results/session18/ragged_choice_{c}_{method}.json", "w"))
print(method, "drafter ran in", drafter_runs, "rounds of >= 2 rows")
for src in sorted({k[0] for k in rounds}):
    rows = rounds[(src, "rows")]
    print(f"  {src:10} rows {rows:5d}  verified/row {rounds[(src, 'verified')] / rows:.2f}  accepted/row {rounds[(src, 'accepted')] / rows:.2f}")
full = [r for r in records if "accepted" in r]
total_rows = sum(r["rows"] for r in full)
if total_rows:
    chosen = sum(sum(r["lens"]) for r in full) / total_rows
    acc = sum(sum(r["accepted"]) for r in full) / total_rows
    pred = 0.0  # expected accepted drafts of the chosen prefixes, from the rates the policy saw
    for r in full:
        for row, length in zip(r["rates"], r["lens"]):
            p = 1.0
            for k in range(length - 1):
                p *= row[k]
                pred += p
    print(f"{len(full)} ragged choices: verify per row {chosen:.2f}, accepted drafts per row {acc:.2f} (predicted {pred / total_rows:.2f})")
    last = full[-1]
    print("last ragged table (tokens: ms):", {k: round(v * 1e3, 1) for k, v in last["table"].items()}, "plain step", round(last["plain"] * 1e3, 1))
by_size = {}
for rows, tokens, seconds in forwards:
    if rows == c:
        by_size.setdefault(tokens, []).append(seconds * 1e3)
print(f"ragged forwards of {c} rows: new tokens -> ms (median, min, max, count)")
for tokens, values in sorted(by_size.items()):
    values.sort()
    print(f"  {tokens:3d}: {values[len(values) // 2]:6.1f} {values[0]:6.1f} {values[-1]:6.1f}  x{len(values)}")
