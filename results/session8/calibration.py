"""Are draft-tree node probabilities calibrated? Predicted reach probability vs reached, per source and branch rank.

python results/session8/calibration.py [num_prompts_per_domain] [dtype]   (session 8 probe)
"""
import sys
from collections import defaultdict

import torch

from adaflash_hf import DraftingConfig, DraftingState, GoodputVerifyLength, generate, load_target
from adaflash_hf.bench import BenchArgs, load_bench_prompts
from adaflash_hf.cli_args import encode_prompt
from adaflash_hf.decoding import proposers, state as state_mod
from adaflash_hf.drafters import load_drafter

torch.set_num_threads(2)
n, dtype = int(sys.argv[1]) if len(sys.argv) > 1 else 2, sys.argv[2] if len(sys.argv) > 2 else "bf16"
target, tok = load_target("smollm2-135m", dtype=dtype)
drafter = load_drafter("auto", target, target_name="smollm2-135m")
prompts = load_bench_prompts(BenchArgs(num_prompts=n, methods="target"))
bins = defaultdict(lambda: [0.0, 0, 0])  # (source, first-token rank, prob bin) -> [sum predicted, nodes, reached]
last = {}
build = proposers.build_tree


def recording_build(candidates, max_nodes, max_depth):
    tree = build(candidates, max_nodes, max_depth)
    last.setdefault("trees", []).append(tree)
    return tree


proposers.build_tree = recording_build
tree_proposal = proposers.HybridProposer._tree_proposal


def fresh_round(self, options_per_row, max_depths):
    last["trees"] = []  # this round's trees, one per row
    last["options"] = options_per_row
    return tree_proposal(self, options_per_row, max_depths)


proposers.HybridProposer._tree_proposal = fresh_round
accept = state_mod.tree_accept


def recording_accept(draft_tokens, parents, logits, num_drafts, params, generator=None):
    paths, nxt = accept(draft_tokens, parents, logits, num_drafts, params, generator)
    trees = last["trees"]
    for tree, options, path, count in zip(trees, last["options"], paths, num_drafts.tolist()):
        on_path = set(path)
        for j in range(count):
            p = tree.probs[j]
            source, _, features = options[tree.origins[j]]
            rank = features[0][4] if features and len(features[0]) == 5 else 0
            key = (f"d1 {source} r{rank}" if tree.depths[j] == 1 else "deeper", min(int(p * 10), 9))
            b = bins[key]
            b[0] += p
            b[1] += 1
            b[2] += (j + 1) in on_path
    return paths, nxt


state_mod.tree_accept = recording_accept
ds, pol = DraftingState(), GoodputVerifyLength()
for item in prompts:
    ids = encode_prompt(tok, item["prompt"])
    last["trees"] = []
    generate(target, drafter, ids, torch.ones_like(ids), max_new_tokens=96, do_sample=False, pad_token_id=tok.pad_token_id,
             drafting=DraftingConfig(), drafting_state=ds, verify_policy=pol)
print(f"{'node':<16} {'prob bin':>8} {'nodes':>6} {'predicted':>9} {'reached':>8}")
for key in sorted(bins):
    s, c, r = bins[key]
    print(f"{key[0]:<16} {key[1] / 10:>8.1f} {c:>6} {s / c:>9.3f} {r / c:>8.3f}")
