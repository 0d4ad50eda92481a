"""Session 17 probe: the Python cost of one proposal (look-ups in every index, the drafter's scores, the draft tree)
for b rows, with a given datastore, against replayed greedy outputs (results/session9/simulate.py's cache).

python results/session17/propose_cost.py ROWS [DATASTORE]
"""
import cProfile
import json
import pstats
import sys
import time
from pathlib import Path

import torch

from adaflash_hf.decoding.proposers import DraftingState, HybridProposer, load_datastore

rows_n = int(sys.argv[1])
path = sys.argv[2] if len(sys.argv) > 2 else "adaflash_hf/bundled/smollm2-135m/datastore.safetensors"
cache = json.loads(Path("/work/sim_cache/smollm2_bf16.json").read_text())
drafts = json.loads(Path("/work/sim_cache/smollm2_bf16_drafts.json").read_text())
state = DraftingState()
state.drafter_is_cheap = lambda rows: True  # score every round, as where the drafter pass is cheap
proposer = HybridProposer(state, state.config, 8, load_datastore(path))
rows = list(range(rows_n))
picks = [cache[(7 * i) % len(cache)] for i in rows]
for r, row in zip(rows, picks):
    proposer.add_row(r, row["prompt"] + row["output"][:32])


def run_drafter():
    blocks = [drafts[(7 * i) % len(cache)][31] for i in rows]
    tokens = torch.tensor([[ids[0] for ids in b["ids"]] for b in blocks])
    probs = torch.tensor([[p[0] for p in b["probs"]] for b in blocks])

    def score(queries):
        return [[dict(zip(blocks[i]["ids"][j], blocks[i]["probs"][j])).get(t, 0.0) if j < 7 else None
                 for j, t in enumerate(toks)] for i, toks in queries]

    return tokens, probs, score


for _ in range(5):
    proposer.propose(rows, run_drafter, tree=True, max_depths=[16] * rows_n)
n = 50
start = time.perf_counter()
for _ in range(n):
    proposer.propose(rows, run_drafter, tree=True, max_depths=[16] * rows_n)
print(f"{rows_n} rows, {path}: {(time.perf_counter() - start) / n * 1e3:.2f} ms per proposal")
profile = cProfile.Profile()
profile.enable()
for _ in range(20):
    proposer.propose(rows, run_drafter, tree=True, max_depths=[16] * rows_n)
profile.disable()
pstats.Stats(profile).sort_stats("cumulative").print_stats(14)
