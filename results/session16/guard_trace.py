"""Session 16 probe: why the adaptive server speculates at high load. Serves 2c requests at concurrency c (no HTTP,
warmed up as the bench does) and prints every round the guard let speculate: batch size, bucket, whether the bucket
was judged losing, both realised rates, and the round's realised tokens per plain step.

python results/session16/guard_trace.py 16 [passes]
"""
import pathlib
import sys

import torch

from adaflash_hf import load_drafter, load_target
from adaflash_hf.data import load_prompts
from adaflash_hf.serving.loadtest import make_scheduler

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # results/: the probes' helpers
from probes import run_load  # noqa: E402

torch.set_num_threads(2)
target, tok = load_target("smollm2-135m", dtype="auto")
drafter = load_drafter("auto", target, target_name="smollm2-135m")
groups = [[r["prompt"] for r in load_prompts(d, split="eval").to_list()] for d in ("code", "math", "chat", "news")]
mixed = [g[i] for i in range(max(map(len, groups))) for g in groups if i < len(g)]
ids = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, return_dict=True)["input_ids"] for p in mixed]
c = int(sys.argv[1])
s = make_scheduler("adaflash", target, drafter, tok, 32, "smollm2-135m")
policy = s.batch.policy
trace, live = [], {"on": False}
guard, update = policy._guard, policy.update


def traced_guard(rows):
    answer = guard(rows)
    if live["on"]:
        bucket = rows.bit_length()
        trace.append([rows, bucket, answer, policy.losing(bucket), policy.rate(bucket, False), policy.rate(bucket, True), None])
    return answer


def traced_update(accept_lengths, verify_lens, seconds, proposed=None):
    if live["on"] and trace and trace[-1][2]:
        plain_step = policy.cost_model.cost_batch(len(verify_lens), 1)
        trace[-1][6] = float((accept_lengths + 1).sum()) / len(verify_lens) / (seconds / plain_step)
        trace[-1].append((round(float((accept_lengths + 1).sum()) / len(verify_lens), 2), round(seconds / plain_step, 2),
                          verify_lens.tolist()))
    update(accept_lengths, verify_lens, seconds, proposed=proposed)


policy._guard, policy.update = traced_guard, traced_update




passes = int(sys.argv[2]) if len(sys.argv) > 2 else 1  # as the bench's --repeats: the last pass is traced
run_load(s, ids[-4:], 2, 16)
run_load(s, ids[:c], c, 8)
for p in range(passes):
    s.drafting_state.forget_requests()
    live["on"] = p == passes - 1
    run_load(s, ids[:max(16, 2 * c)] if passes > 1 else ids[:2 * c], c, 64)
spec = [t for t in trace if t[2]]
print(f"c={c}: {len(trace)} rounds, {len(spec)} speculative")
for rows, bucket, _, losing, plain, rate, realised, *detail in spec:
    print(f"rows {rows:2d} bucket {bucket} losing {losing!s:5} plain {plain or 0:.3f} spec {rate or 0:.3f} -> round realised {realised or 0:.3f}"
          f" (tokens/row, plain steps, verify lengths: {detail[0] if detail else None})")
print("explore intervals", policy._explore)
print("trace (S speculative, . plain; lower case where the bucket was judged losing):")
print("".join(("S" if t[2] else ".") if not t[3] else ("s" if t[2] else ",") for t in trace))
flips = [i for i in range(1, len(trace)) if trace[i][3] and not trace[i - 1][3]]
for i in flips[:4]:
    window = [t for t in trace[max(0, i - 6):i + 1]]
    print(f"turned losing at round {i}:", [(t[2], round(t[4] or 0, 3), round(t[5] or 0, 3), t[6] and round(t[6], 3)) for t in window])
