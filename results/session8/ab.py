"""A/B of engine configs on held-out prompts, alternating per prompt (session 8 probe)."""
import sys, time, json, torch
from adaflash_hf import DraftingConfig, DraftingState, GoodputVerifyLength, generate, load_target, enable_adaflash
from adaflash_hf.drafters import load_drafter
from adaflash_hf.bench import load_bench_prompts, BenchArgs
from adaflash_hf.cli_args import encode_prompt
torch.set_num_threads(2)
dtype = sys.argv[1]; n = int(sys.argv[2])
configs = json.loads(sys.argv[3])  # name -> DraftingConfig kwargs
target, tok = load_target("smollm2-135m", dtype=dtype)
drafter = load_drafter("auto", target, target_name="smollm2-135m")
prompts = load_bench_prompts(BenchArgs(num_prompts=n, methods="target"))
states = {k: DraftingState() for k in configs}
pols = {k: GoodputVerifyLength() for k in configs}
res = {k: [0.0, 0, 0, 0] for k in ["plain", *configs]}
def run(name, ids):
    if name == "plain":
        out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=96, do_sample=False, pad_token_id=tok.pad_token_id)
        return out.shape[1] - ids.shape[1], 0
    out = generate(target, drafter, ids, torch.ones_like(ids), max_new_tokens=96, do_sample=False, pad_token_id=tok.pad_token_id,
                   drafting=DraftingConfig(**configs[name]), drafting_state=states[name], verify_policy=pols[name])
    return out.num_new_tokens[0], out.stats.num_rounds
warm = encode_prompt(tok, "Hello!")
for k in res: run(k, warm)
for i, item in enumerate(prompts):
    ids = encode_prompt(tok, item["prompt"])
    for k in res:
        t = time.perf_counter(); new, rounds = run(k, ids); dt = time.perf_counter() - t
        r = res[k]; r[0] += dt; r[1] += new; r[2] += rounds
for k, (s, new, rounds, _) in res.items():
    base = res["plain"][1] / res["plain"][0]
    print(f"{k:<12} tok/s {new / s:6.1f}  x{new / s / base:5.2f}  tau {new / rounds if rounds else 1:5.2f}")
