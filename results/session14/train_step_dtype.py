"""One drafter training step (forward + backward + AdamW) under bf16 autocast against plain fp32.

python results/session14/train_step_dtype.py   (session 14 probe; bundled SmolLM2 drafter, fp32 target,
one 512-token sequence of random ids, 32 anchors, 7 predicted positions; median of 5 steps after 1 warm-up)
On CPUs without bf16 hardware, autocast emulates bf16 and is the slow choice; compute_autocast picks fp32 there.
"""
import contextlib
import time

import torch

from adaflash_hf import load_drafter, load_target
from adaflash_hf.targets import resolve_dtype
from adaflash_hf.training.anchors import sample_anchors
from adaflash_hf.training.data import TrainingSequence, collate, target_features
from adaflash_hf.training.losses import position_weights
from adaflash_hf.training.step import drafter_block_forward

torch.set_num_threads(2)
target, _ = load_target("smollm2-135m", dtype="fp32", pack_weights=False)
drafter = load_drafter("auto", target, target_name="smollm2-135m").float().train()
optimizer = torch.optim.AdamW(drafter.parameters(), lr=1e-5)
generator = torch.Generator().manual_seed(0)
batch = collate([TrainingSequence(torch.randint(100, 20000, (512,), generator=generator), 64)], target.config.pad_token_id or 0)
features = target_features(target, batch, drafter.config.target_layer_ids)
anchors, valid = sample_anchors(batch.label_mask, 32, generator)
weights = position_weights(drafter.config.block_size, 4.0)
print("automatic choice here:", resolve_dtype("auto", torch.device("cpu")))
for name, context in (("bf16 autocast", lambda: torch.autocast("cpu", dtype=torch.bfloat16)), ("fp32", contextlib.nullcontext)):
    times = []
    for _ in range(6):
        start = time.perf_counter()
        with context():
            out = drafter_block_forward(drafter, target, batch, features, anchors, valid, weights, consistent_labels=True)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - start)
    print(f"{name:>14}: {sorted(times[1:])[2] * 1e3:.0f} ms per step")
