"""Does OPD training grow resident memory? (session 20: the 1,000-request soak grew 1 GB after warm-up, in
steps while the trainer ran, not while it was paused.)

Trains the OPD trainer synchronously on recorded trajectories (a results/opd_offline.py cache) with its
publication checks, prints RSS every --every steps, then calls glibc's malloc_trim(0): a leak keeps the
memory, allocator fragmentation gives it back.

Usage: python results/session20/opd_memory.py CACHE.pt [--steps 200] [--dtype fp32] [--trim-every 0]
"""
import argparse
import ctypes

import torch

from adaflash_hf import load_drafter, load_target
from adaflash_hf.online import AdaFlashOPD, OPDConfig
from adaflash_hf.online.soak import rss_mb


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("cache")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--trim-every", type=int, default=0, help="malloc_trim(0) every this many steps (0: only at the end)")
    args = parser.parse_args()
    libc = ctypes.CDLL("libc.so.6")
    train, held_out = torch.load(args.cache, weights_only=False)
    target, _ = load_target("smollm2-135m", dtype=args.dtype)
    opd = AdaFlashOPD(target, load_drafter("auto", target, target_name="smollm2-135m"), OPDConfig())
    for t in train:
        opd.buffer.add(t)
    print(f"loaded: rss {rss_mb():.0f} MiB", flush=True)
    generator = torch.Generator().manual_seed(0)
    for step in range(1, args.steps + 1):
        if opd._retention_text:
            opd._build_retention()
            continue
        picks = torch.randperm(len(train), generator=generator)[: opd.config.batch_trajectories].tolist()
        opd._guarded_step(opd.with_rehearsal([train[i] for i in picks], generator))
        if step % 8 == 0:
            opd.check_set.extend(held_out[:16])
            opd._check_and_publish()
        if args.trim_every and step % args.trim_every == 0:
            libc.malloc_trim(0)
        if step % args.every == 0:
            print(f"step {step}: rss {rss_mb():.0f} MiB, published {opd.counters['published']}", flush=True)
    before = rss_mb()
    libc.malloc_trim(0)
    print(f"end: rss {before:.0f} MiB, after malloc_trim {rss_mb():.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
