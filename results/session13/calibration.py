"""Session 13 probe: are the verify-length policy's acceptance estimates calibrated in served rounds?

For every speculative round it compares the drafts the policy expected to be accepted (for each row, the sum over
its verified drafts of the product of their estimated conditional rates, the quantity the goodput choice maximises)
with the drafts that were accepted, overall and by batch size. Acceptance does not depend on timing, so this runs
on a shared machine too (the verify lengths chosen do: they follow the measured costs).

python results/session13/calibration.py CONCURRENCY [REQUESTS]
"""
import asyncio
import sys
from collections import defaultdict

import torch

from adaflash_hf import load_drafter, load_target
from adaflash_hf.data import load_prompts
from adaflash_hf.serving.loadtest import make_scheduler, serve_while
from adaflash_hf.serving.scheduler import RequestParams

torch.set_num_threads(2)
c = int(sys.argv[1])
count = int(sys.argv[2]) if len(sys.argv) > 2 else max(16, 2 * c)
target, tok = load_target("smollm2-135m", dtype="bf16")
drafter = load_drafter("auto", target, target_name="smollm2-135m")
groups = [[r["prompt"] for r in load_prompts(d, split="eval").to_list()] for d in ("code", "math", "chat", "news")]
prompts = [g[i] for i in range(max(map(len, groups))) for g in groups if i < len(g)]
ids = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, return_dict=True)["input_ids"]
       for p in prompts[:count]]
s = make_scheduler("adaflash", target, drafter, tok, 32, "smollm2-135m")
policy = s.batch.policy
expected_of_round = []
choose = policy.verify_lens


def verify_lens(rates, hidden, sources=None):
    lengths = choose(rates, hidden, sources)
    r = policy.head_rates(rates, hidden, sources) if hasattr(policy, "head_rates") else rates
    gains = r.float().clamp(0, 1).cumprod(-1)
    expected_of_round.append([float(gains[i, : int(n) - 1].sum()) for i, n in enumerate(lengths.tolist())])
    return lengths


policy.verify_lens = verify_lens
by_rows = defaultdict(lambda: [0.0, 0.0, 0, 0])  # rows bucket -> expected, accepted, verified drafts, row-rounds
inner = s.batch.on_round


def record(stats):
    inner(stats)
    if not hasattr(stats, "verify_lens") or not expected_of_round:
        return
    expected = expected_of_round.pop()
    expected_of_round.clear()
    if max(stats.verify_lens) <= 1:
        return
    bucket = len(stats.rows).bit_length()
    sums = by_rows[bucket]
    sums[0] += sum(expected)
    sums[1] += sum(stats.accept_lengths)
    sums[2] += sum(v - 1 for v in stats.verify_lens)
    sums[3] += len(stats.rows)


s.batch.on_round = record


async def main():
    sem = asyncio.Semaphore(c)

    async def one(p):
        async with sem:
            return await s.submit(p, RequestParams(max_new_tokens=64)).collect()

    return await asyncio.gather(*(one(p) for p in ids))

serve_while(s, main)
print(f"c={c}, {count} requests: speculative rounds by batch size")
for bucket in sorted(by_rows):
    e, a, v, n = by_rows[bucket]
    print(f"  rows {2 ** (bucket - 1)}-{2 ** bucket - 1}: {n} row-rounds, verified {v / n:.2f} drafts/row, "
          f"expected accepted {e / n:.2f}, accepted {a / n:.2f} (realised/expected {a / max(e, 1e-9):.2f})")
