"""Does the reduced draft vocabulary cap the drafter on a domain it never saw? (session 20, issue 9)

The bundled SmolLM2 drafter proposes only the 4,096 tokens most frequent in the target's answers to its
code/math/chat training prompts. Teacher-forced held-out tau (the OPD publication check's measure) of the
untrained drafter on recorded trajectories of a domain, with: its shipped draft vocabulary; the full vocabulary;
and the shipped one with the rarest entries swapped for the tokens most frequent in the *train* trajectories
(the live stream) that it lacks. No training, no timing (may share the machine).

Usage: python results/session20/vocab_probe.py CACHE.pt [--swap 256,512,1024]
       (CACHE: a results/opd_offline.py recording, (train, held_out) trajectories)
"""
import argparse
import collections

import torch

from adaflash_hf import load_drafter, load_target
from adaflash_hf.modeling_adaflash import AdaFlashDrafter
from adaflash_hf.online import AdaFlashOPD, OPDConfig


def drafter_module(opd):
    return next(m for m in opd.train_model.modules() if isinstance(m, AdaFlashDrafter))


def live_vocab(shipped, train, swap):
    """The shipped vocabulary (frequency-ranked) with its last ``swap`` entries replaced by the live stream's most
    frequent generated tokens it lacks."""
    have = set(shipped.tolist())
    counts = collections.Counter(t for tr in train for t in tr.tokens[tr.prompt_len:].tolist() if t not in have)
    new = [t for t, _ in counts.most_common(swap)]
    kept = shipped[: len(shipped) - len(new)]
    return torch.cat([kept, torch.tensor(new, dtype=shipped.dtype)]), len(new)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("cache")
    parser.add_argument("--swap", default="256,512,1024")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    train, held_out = torch.load(args.cache, weights_only=False)
    target, _ = load_target("smollm2-135m", dtype="bf16")
    opd = AdaFlashOPD(target, load_drafter("auto", target, target_name="smollm2-135m"), OPDConfig(retention_trajectories=0,
                                                                                                rehearsal_trajectories=0))
    module = drafter_module(opd)
    shipped = module.draft_vocab.clone()
    generated = [t for tr in held_out for t in tr.tokens[tr.prompt_len:].tolist()]
    have = set(shipped.tolist())
    print(f"{len(train)} train, {len(held_out)} held-out trajectories; held-out generated tokens in the shipped vocabulary: "
          f"{sum(t in have for t in generated) / len(generated):.3f}")
    variants = [("shipped", shipped), ("full", None)]
    for swap in (int(s) for s in args.swap.split(",")):
        vocab, n = live_vocab(shipped, train, swap)
        cover = sum(t in set(vocab.tolist()) for t in generated) / len(generated)
        variants.append((f"swap{n} (held-out coverage {cover:.3f})", vocab))
    for name, vocab in variants:
        module.set_draft_vocab(vocab)
        tau, pos = opd.held_out_tau(trajectories=held_out, num_anchors=64)
        print(f"{name}: tau {tau:.4f} positions {[round(p, 3) for p in pos[:4]]}", flush=True)


if __name__ == "__main__":
    main()
