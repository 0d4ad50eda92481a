"""Offline OPD probe behind results/experiments.md (session 6): does any setting teach the shipped SmolLM2
drafter a domain it never saw, from a few hundred live requests?

Records the target's own trajectories on train prompts (the live stream) and eval prompts (held out) of one
domain once (cached under --cache), then trains LoRA variants with AdaFlashOPD's own step, synchronously,
and prints the teacher-forced held-out tau (the same measure the worker's publication check uses) every
--eval-every steps. No timing is reported, so it may share the machine.

Usage: python results/opd_offline.py --variants base,lr3e-3,rank64,fc --steps 240
"""
import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

from adaflash_hf import load_drafter, load_target
from adaflash_hf.cli_args import encode_prompt
from adaflash_hf.data import load_prompts
from adaflash_hf.decoding.engine import generate
from adaflash_hf.online import AdaFlashOPD, OPDConfig
from adaflash_hf.online.trajectories import TrajectoryBuffer, TrajectoryRecorder

VARIANTS = {  # one change at a time against "base" (the OPDConfig defaults)
    "base": {},
    "lr1e-3": {"lr": 1e-3},
    "lr3e-3": {"lr": 3e-3},
    "rank64": {"lora_rank": 64, "lora_alpha": 128.0},
    "alpha1": {"alpha": 1.0},  # CE on the target's argmax only
    "alpha0.5": {"alpha": 0.5},
    "norej": {"rejected_weight": 1.0},
    "anchors16": {"num_anchors": 16, "batch_trajectories": 8, "lr": 1e-3},  # more trajectories per step, same cost
    # session 12: is it capacity (LoRA on the decoder layer only) or data? (probe-only keys start with "_")
    "lr1e-3-a16": {"num_anchors": 16, "batch_trajectories": 8, "lr": 1e-3, "passes": 1},
    "fc": {"num_anchors": 16, "batch_trajectories": 8, "lr": 1e-3, "passes": 1, "_targets": "fc"},
    "full": {"num_anchors": 16, "batch_trajectories": 8, "lr": 1e-3, "passes": 1, "_full": True},
    "full3e-4": {"num_anchors": 16, "batch_trajectories": 8, "lr": 3e-4, "passes": 1, "_full": True},
    "rank64-3e-3": {"num_anchors": 16, "batch_trajectories": 8, "lr": 3e-3, "passes": 1, "lora_rank": 64, "lora_alpha": 128.0},
    "rank64-1e-2": {"num_anchors": 16, "batch_trajectories": 8, "lr": 1e-2, "passes": 1, "lora_rank": 64, "lora_alpha": 128.0},
    "rank64-fc-3e-3": {"num_anchors": 16, "batch_trajectories": 8, "lr": 3e-3, "passes": 1, "lora_rank": 64, "lora_alpha": 128.0, "_targets": "fc"},
    "rank16-3e-3": {"num_anchors": 16, "batch_trajectories": 8, "lr": 3e-3, "passes": 1},
    "rank64-3e-3-reh2": {"num_anchors": 16, "batch_trajectories": 8, "lr": 3e-3, "passes": 1, "lora_rank": 64, "lora_alpha": 128.0,
                         "rehearsal_trajectories": 2},
    "rank64-3e-3-reh8": {"num_anchors": 16, "batch_trajectories": 8, "lr": 3e-3, "passes": 1, "lora_rank": 64, "lora_alpha": 128.0,
                         "rehearsal_trajectories": 8},
    "full-noreh": {"num_anchors": 16, "batch_trajectories": 8, "lr": 1e-3, "passes": 1, "_full": True, "rehearsal_trajectories": 0},
    "pos2": {"loss_positions": 2},  # session 20: positions 3+ are never accepted on fiction; spend the loss on 1-2
    "alpha0.2": {"alpha": 0.2},  # session 20: mostly the clipped reverse KL on the teacher's top-32 (soft labels)
    "full-noreh-swap512": {"num_anchors": 16, "batch_trajectories": 8, "lr": 1e-3, "passes": 1, "_full": True, "rehearsal_trajectories": 0,
                           "_swap": 512},  # session 20: + the live stream's 512 most frequent tokens the draft vocabulary lacks
    "default-swap512": {"_swap": 512},
    "default": {},  # OPDConfig's defaults (session 12: r64, lr 1e-3, 8 x 16 anchors, rehearsal 4)
    "rank64-1e-3-reh4": {"num_anchors": 16, "batch_trajectories": 8, "lr": 1e-3, "passes": 1, "lora_rank": 64, "lora_alpha": 128.0,
                         "rehearsal_trajectories": 4},
}


def record(target, drafter, tokenizer, prompts, max_new_tokens):
    buffer = TrajectoryBuffer(10_000, 8 << 30)
    recorder = TrajectoryRecorder(buffer, top_k=32)
    for i, prompt in enumerate(prompts):
        ids = encode_prompt(tokenizer, prompt)
        generate(target, drafter, ids, torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                 pad_token_id=tokenizer.pad_token_id, observer=recorder)
        print(f"  recorded {i + 1}/{len(prompts)}", file=sys.stderr, flush=True)
    return buffer.take(10_000)


def truncated(t, n):
    end = t.prompt_len + min(n, t.num_generated)
    return dataclasses.replace(t, tokens=t.tokens[:end], features=t.features[: end - 1], teacher_ids=t.teacher_ids[: end - t.prompt_len],
                               teacher_logprobs=t.teacher_logprobs[: end - t.prompt_len], rejected=t.rejected[:end])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--domain", default="fiction")
    parser.add_argument("--train-requests", type=int, default=200)
    parser.add_argument("--eval-prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--eval-max-new-tokens", type=int, default=None, help="held-out length (default: --max-new-tokens)")
    parser.add_argument("--truncate", type=int, default=None, help="train on the first N generated tokens of each live trajectory")
    parser.add_argument("--variants", default="base")
    parser.add_argument("--steps", type=int, default=240)
    parser.add_argument("--eval-every", type=int, default=40)
    parser.add_argument("--eval-anchors", type=int, default=None, help="blocks per held-out trajectory (default: the step's)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cache", default="runs/opd_offline")
    parser.add_argument("--out", default="results/opd_offline.jsonl")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target, tokenizer = load_target("smollm2-135m", dtype="bf16")
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    eval_tokens = args.eval_max_new_tokens or args.max_new_tokens
    suffix = "" if eval_tokens == args.max_new_tokens else f"_eval{eval_tokens}"
    path = cache / f"{args.domain}_{args.train_requests}_{args.eval_prompts}_{args.max_new_tokens}{suffix}.pt"
    if path.exists():
        train, held_out = torch.load(path, weights_only=False)
    else:
        drafter = load_drafter("auto", target, target_name="smollm2-135m")
        eval_rows = load_prompts(args.domain, split="eval", limit_per_domain=args.eval_prompts).to_list()
        eval_set = {r["prompt"] for r in eval_rows}
        live = [r["prompt"] for r in load_prompts(args.domain, split="train").to_list() if r["prompt"] not in eval_set]
        live = [live[i % len(live)] for i in range(args.train_requests)]
        held_out = record(target, drafter, tokenizer, [r["prompt"] for r in eval_rows], eval_tokens)
        train = record(target, drafter, tokenizer, live, args.max_new_tokens)
        torch.save((train, held_out), path)
    if args.truncate:  # the first N generated tokens of each live trajectory: what shorter answers would have given
        train = [truncated(t, args.truncate) for t in train]
    print(f"{len(train)} train and {len(held_out)} held-out trajectories, "
          f"{sum(t.num_generated for t in train)} live tokens", file=sys.stderr)
    for name in args.variants.split(","):
        drafter = load_drafter("auto", target, target_name="smollm2-135m")
        config = {k: v for k, v in VARIANTS[name].items() if not k.startswith("_")}
        extra = VARIANTS[name].get("_targets")
        if extra:  # LoRA also on these drafter linears
            import functools

            from adaflash_hf.online import adapters
            from adaflash_hf.online import opd as opd_module
            opd_module.LoraSettings = functools.partial(adapters.LoraSettings, target_modules=adapters.DEFAULT_TARGET_MODULES + (extra,))
        opd = AdaFlashOPD(target, drafter, OPDConfig(**config))
        if VARIANTS[name].get("_full"):  # every drafter weight trains (the target's embeddings and head stay frozen)
            for param in opd.train_model.parameters():
                param.requires_grad_(True)
            opd._optimizer = opd._new_optimizer()
        if VARIANTS[name].get("_swap"):  # swap the rarest draft-vocabulary entries for live tokens it lacks
            sys.path.insert(0, str(Path(__file__).parent / "session20"))
            from vocab_probe import drafter_module, live_vocab

            module = drafter_module(opd)
            module.set_draft_vocab(live_vocab(module.draft_vocab, train, VARIANTS[name]["_swap"])[0])
        while opd._retention_text:  # the retention check set (and rehearsal pool) from the drafter's datastore
            opd._build_retention()
        tau0, pos0 = opd.held_out_tau(trajectories=held_out, num_anchors=args.eval_anchors)
        curve = [{"step": 0, "tau": tau0, "positions": pos0[:4], "retention_tau": opd.retention_base_tau}]
        print(f"{name}: step 0 tau {tau0:.4f} positions {[round(p, 3) for p in pos0[:4]]} retention {opd.retention_base_tau:.4f}", flush=True)
        generator = torch.Generator().manual_seed(0)
        start = time.perf_counter()
        for step in range(1, args.steps + 1):
            picks = torch.randperm(len(train), generator=generator)[: opd.config.batch_trajectories].tolist()
            opd._guarded_step(opd.with_rehearsal([train[i] for i in picks], generator))
            if step % args.eval_every == 0:
                tau, pos = opd.held_out_tau(trajectories=held_out, num_anchors=args.eval_anchors)
                retained, _ = opd.held_out_tau(trajectories=opd.retention_set)
                curve.append({"step": step, "tau": tau, "positions": pos[:4], "loss": opd.last_loss, "retention_tau": retained})
                print(f"{name}: step {step} tau {tau:.4f} positions {[round(p, 3) for p in pos[:4]]} loss {opd.last_loss:.3f} "
                      f"retention {retained:.4f} ({time.perf_counter() - start:.0f}s)", flush=True)
        with open(args.out, "a") as f:
            f.write(json.dumps({"variant": name, "config": VARIANTS[name], "domain": args.domain, "train": len(train),
                                "max_new_tokens": args.max_new_tokens, "truncate": args.truncate,
                                "held_out": len(held_out), "steps": args.steps, "curve": curve}) + "\n")


if __name__ == "__main__":
    main()
