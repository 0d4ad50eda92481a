"""Where a batch-1 round's time goes on held-out prompts of one domain (session 17 probe).

python results/session17/round_costs.py [domain] [num_prompts]   (idle machine, 2 threads, bf16)

Runs plain decoding (transformers generate) and the default engine prompt by prompt, and splits each engine
round into propose (look-ups, drafter, tree), verify (target forward + acceptance) and the rest (crop,
bookkeeping, policy), in units of the same prompt's plain step.
"""
import sys
import time
from collections import defaultdict

import torch

from adaflash_hf import DraftingState, generate, load_drafter, load_target
from adaflash_hf.bench import BenchArgs, load_bench_prompts
from adaflash_hf.cli_args import encode_prompt

domain = sys.argv[1] if len(sys.argv) > 1 else "chat"
n = int(sys.argv[2]) if len(sys.argv) > 2 else 8
torch.set_num_threads(2)
target, tok = load_target("smollm2-135m", dtype="bf16")
drafter = load_drafter("auto", target, target_name="smollm2-135m")
state = DraftingState()
prompts = load_bench_prompts(BenchArgs(num_prompts=n, methods="target", domains=domain))
warm = load_bench_prompts(BenchArgs(num_prompts=2, methods="target", domains="code"))
for p in warm:  # warm both paths and the state
    ids = encode_prompt(tok, p["prompt"])
    target.generate(ids, max_new_tokens=16, do_sample=False, pad_token_id=tok.pad_token_id)
    generate(target, drafter, ids, torch.ones_like(ids), max_new_tokens=96, do_sample=False, pad_token_id=tok.pad_token_id,
             drafting_state=state)
totals = defaultdict(float)
predicted = []  # per round: expected accepted drafts of what was verified, by the estimator
original = state.policy.verify_lens


def spy(rates, hidden, sources=None):
    lens = original(rates, hidden, sources)
    g = int(lens[0]) - 1
    predicted.append(float(rates[0, :g].float().cumprod(-1).sum()) if g > 0 else 0.0)
    return lens


state.policy.verify_lens = spy
for k, p in enumerate(prompts):
    ids = encode_prompt(tok, p["prompt"])
    t0 = time.perf_counter()
    target.generate(ids, max_new_tokens=96, min_new_tokens=96, do_sample=False, pad_token_id=tok.pad_token_id)
    step = (time.perf_counter() - t0) / 96
    marks = []
    predicted.clear()

    def on_tokens(row, tokens, marks=marks):
        marks.append(time.perf_counter())

    t0 = time.perf_counter()
    out = generate(target, drafter, ids, torch.ones_like(ids), max_new_tokens=96, do_sample=False,
                   pad_token_id=tok.pad_token_id, drafting_state=state, on_tokens=on_tokens)
    total = time.perf_counter() - t0
    r = [s for s in out.stats.rounds if s.verify_lens][1:]  # the first round catches the drafter up on the prompt
    walls = [b - a for a, b in zip(marks[1:-1], marks[2:])]  # round k's wall time: between the tokens of rounds k-1 and k
    draft = sum(s.draft_time for s in r) / max(len(r) - 1, 1)
    verify = sum(s.verify_time for s in r) / max(len(r) - 1, 1)
    wall = sum(walls) / max(len(walls), 1)
    vl = sum(s.verify_lens[0] for s in r) / len(r)
    acc = sum(s.accept_lengths[0] for s in r) / len(r)
    spec = sum(s.verify_lens[0] > 1 for s in r) / len(r)
    pred = sum(predicted[1:]) / max(len(predicted) - 1, 1)
    new = out.sequences.shape[1] - ids.shape[1]
    print(f"prompt {k}: plain step {step*1e3:.1f} ms | round {wall/step:.2f} steps = propose {draft/step:.2f} + verify {verify/step:.2f}"
          f" + rest {(wall-draft-verify)/step:.2f} | rounds {len(r)} speculative {spec:.0%} verify len {vl:.2f} accepted {acc:.2f} predicted {pred:.2f}"
          f" | tau {new/(len(r)+1):.2f} speed-up {96*step/total:.2f}x", flush=True)
    for key, v in (("step", step), ("wall", wall), ("draft", draft), ("verify", verify), ("speed", 96 * step / total)):
        totals[key] += v / len(prompts)
print(f"mean: round {totals['wall']/totals['step']:.2f} steps = propose {totals['draft']/totals['step']:.2f} + verify "
      f"{totals['verify']/totals['step']:.2f} + rest {(totals['wall']-totals['draft']-totals['verify'])/totals['step']:.2f}; "
      f"speed-up {totals['speed']:.2f}x")
print("verify cost table (ms):", {k: round(v * 1e3, 1) for k, v in sorted(state.cost_model.seconds.items())})
print("drafter ms:", {k: round(v * 1e3, 2) for k, v in state.drafter_seconds.items()})
