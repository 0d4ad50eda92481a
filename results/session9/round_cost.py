"""Tree against chain rounds on chat prompts: wall, propose and verify time per round from RoundStats (session 9 probe).

python results/session9/round_cost.py   (idle machine, 2 threads)
"""
import time

import torch

from adaflash_hf import DraftingConfig, DraftingState, generate, load_drafter, load_target
from adaflash_hf.bench import BenchArgs, load_bench_prompts
from adaflash_hf.cli_args import encode_prompt

torch.set_num_threads(2)
target, tok = load_target("smollm2-135m", dtype="bf16")
drafter = load_drafter("auto", target, target_name="smollm2-135m")
prompts = [p for p in load_bench_prompts(BenchArgs(num_prompts=8, methods="target", domains="chat"))]
states = {n: DraftingState() for n in ("tree", "chain")}
cfg = {"tree": DraftingConfig(), "chain": DraftingConfig(tree_nodes=0)}
acc = {n: [0.0, 0.0, 0.0, 0, 0] for n in cfg}
for p in prompts[:6]:
    ids = encode_prompt(tok, p["prompt"])
    for n in cfg:
        t = time.perf_counter()
        out = generate(target, drafter, ids, torch.ones_like(ids), max_new_tokens=96, do_sample=False, pad_token_id=tok.pad_token_id,
                       drafting=cfg[n], drafting_state=states[n])
        wall = time.perf_counter() - t
        r = out.stats.rounds
        a = acc[n]
        a[0] += wall
        a[1] += sum(x.draft_time for x in r)
        a[2] += sum(x.verify_time for x in r)
        a[3] += len(r)
        a[4] += int(out.num_new_tokens[0])
for n, (wall, d, v, rounds, toks) in acc.items():
    print(f"{n}: {toks} tokens, {rounds} rounds, tau {toks/rounds:.2f}; per round: wall {wall/rounds*1e3:.1f} ms, propose {d/rounds*1e3:.1f}, verify {v/rounds*1e3:.1f}, other {(wall-d-v)/rounds*1e3:.1f}")
