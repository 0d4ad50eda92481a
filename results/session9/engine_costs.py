"""What the engine itself measures: its drafter pass, its 1-token forward and its cost table, after generate on 2 code + 2 chat prompts (session 9 probe).

python results/session9/engine_costs.py   (idle machine, 2 threads)
"""
import torch

from adaflash_hf import DraftingState, generate, load_drafter, load_target
from adaflash_hf.bench import BenchArgs, load_bench_prompts
from adaflash_hf.cli_args import encode_prompt

torch.set_num_threads(2)
target, tok = load_target("smollm2-135m", dtype="bf16")
drafter = load_drafter("auto", target, target_name="smollm2-135m")
state = DraftingState()
calls = [0, 0]
orig = state.drafter_is_cheap


def spy(rows):
    cheap = orig(rows)
    calls[0] += 1
    calls[1] += cheap
    return cheap


state.drafter_is_cheap = spy
for p in load_bench_prompts(BenchArgs(num_prompts=2, methods="target", domains="code,chat")):
    ids = encode_prompt(tok, p["prompt"])
    generate(target, drafter, ids, torch.ones_like(ids), max_new_tokens=96, do_sample=False, pad_token_id=tok.pad_token_id, drafting_state=state)
    print(f"drafter {state.drafter_seconds*1e3:.2f} ms, step {state.cost_model.cost(1)*1e3:.1f} ms, ratio {state.drafter_seconds/state.cost_model.cost(1):.3f}, cheap {calls[1]}/{calls[0]} rounds")
print({k: round(v * 1e3, 1) for k, v in sorted(state.cost_model.seconds.items())})
