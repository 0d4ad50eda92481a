"""Session 19 probe: where the draft phase of a served round goes at R rows (torch profiler, record_function blocks).

python results/session19/draft_profile.py [rows] [method]
"""
import pathlib
import sys

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from adaflash_hf.decoding import state as state_module

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # results/: the probes' helpers
from probes import load_smollm2, served_batch  # noqa: E402

target, tok, drafter = load_smollm2()
rows = int(sys.argv[1]) if len(sys.argv) > 1 else 16
method = sys.argv[2] if len(sys.argv) > 2 else "adaflash@4"
batch = served_batch(method, rows, target, tok, drafter)


def wrap(obj, name, label):
    real = getattr(obj, name)

    def labelled(*args, **kwargs):
        with record_function(label):
            return real(*args, **kwargs)

    setattr(obj, name, labelled)


wrap(state_module, "draft_block", "## draft_block")
wrap(state_module, "top_probs_and_tokens", "## top_probs_and_tokens")
wrap(batch.proposer, "propose", "## propose (all)")
wrap(batch.policy, "verify_lens", "## policy.verify_lens")
wrap(batch.target, "forward", "## target forward")
wrap(batch, "_accept", "## accept")
wrap(batch, "_emit", "## emit")
wrap(batch.pending, "take", "## pending.take") if batch.pending is not None else None
with torch.no_grad():
    for _ in range(10):
        batch.step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(10):
            with record_function("## step"):
                batch.step()
table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=40)
print("\n".join(line for line in table.splitlines() if "##" in line or "Name" in line or "aten::linear " in line))
