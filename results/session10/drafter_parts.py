"""Session 10 probe: where the engine's drafter pass goes (context take, projection, drafter forward, draft head), 4 prompts.

python results/session10/drafter_parts.py   (idle machine, 2 threads)
"""
import time, torch, collections
from adaflash_hf import DraftingState, generate, load_drafter, load_target
from adaflash_hf.bench import BenchArgs, load_bench_prompts
from adaflash_hf.cli_args import encode_prompt
from adaflash_hf.decoding import state as st
import adaflash_hf.modeling_adaflash as ma
torch.set_num_threads(2)
target, tok = load_target("smollm2-135m", dtype="bf16")
drafter = load_drafter("auto", target, target_name="smollm2-135m")
T = collections.defaultdict(list)
def wrap(obj, name, key):
    f = getattr(obj, name)
    def g(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); T[key].append(time.perf_counter() - t); return r
    setattr(obj, name, g)
wrap(st, "draft_block", "draft_block")
wrap(st, "top_probs_and_tokens", "top_probs")
wrap(st.PendingContext, "take", "take")
wrap(type(drafter), "project_context", "project_context") if hasattr(type(drafter), "project_context") else None
orig_fwd = type(drafter).forward
def fwd(self, *a, **k):
    t = time.perf_counter(); r = orig_fwd(self, *a, **k); T["drafter.forward"].append(time.perf_counter() - t); return r
type(drafter).forward = fwd
state = DraftingState()
for p in load_bench_prompts(BenchArgs(num_prompts=2, methods="target", domains="code,chat")):
    ids = encode_prompt(tok, p["prompt"])
    generate(target, drafter, ids, torch.ones_like(ids), max_new_tokens=96, do_sample=False, pad_token_id=tok.pad_token_id, drafting_state=state)
for k, v in T.items():
    v = sorted(v); print(f"{k}: n={len(v)} median {v[len(v)//2]*1e3:.2f} ms mean {sum(v)/len(v)*1e3:.2f}")
