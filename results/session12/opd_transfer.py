"""Does a teacher-forced τ gain from OPD training show up in the engine? (session 12)

Trains one results/opd_offline.py variant synchronously on the cached 200 live fiction trajectories, then
measures the engine's τ (drafter alone, full block, greedy; what bench-opd reports) on the held-out fiction
eval prompts and on trained-domain eval prompts, with the base drafter and the trained one.

Usage: python results/session12/opd_transfer.py --variant full --steps 240
"""
import argparse
import copy
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from opd_offline import VARIANTS  # noqa: E402

from adaflash_hf import load_drafter, load_target  # noqa: E402
from adaflash_hf.cli_args import encode_prompt  # noqa: E402
from adaflash_hf.data import load_prompts  # noqa: E402
from adaflash_hf.decoding.engine import generate  # noqa: E402
from adaflash_hf.decoding.policy import FixedVerifyLength  # noqa: E402
from adaflash_hf.decoding.proposers import DraftingConfig, DraftingState  # noqa: E402
from adaflash_hf.online import AdaFlashOPD, OPDConfig  # noqa: E402


def engine_tau(target, drafter, tokenizer, prompts, max_new_tokens=64):
    lengths = []
    for prompt in prompts:
        ids = encode_prompt(tokenizer, prompt)
        state = DraftingState(DraftingConfig(drafter=True, suffix=False, global_index=False, datastore=False, drafter_every_round=True))
        out = generate(target, drafter, ids, torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                       pad_token_id=tokenizer.pad_token_id, verify_policy=FixedVerifyLength(drafter.config.block_size),
                       drafting=state.config, drafting_state=state)
        lengths += [a + 1 for r in out.stats.rounds for a in r.accept_lengths]
    return sum(lengths) / len(lengths)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant", default="full")
    parser.add_argument("--steps", type=int, default=240)
    parser.add_argument("--trained-per-domain", type=int, default=8)
    parser.add_argument("--cache", default="runs/opd_offline/fiction_200_16_64.pt")
    args = parser.parse_args()
    torch.set_num_threads(2)
    target, tokenizer = load_target("smollm2-135m", dtype="bf16")
    train, held_out = torch.load(args.cache, weights_only=False)
    fiction = [r["prompt"] for r in load_prompts("fiction", split="eval", limit_per_domain=16).to_list()]
    trained = [r["prompt"] for d in ("code", "math", "chat") for r in load_prompts(d, split="eval", limit_per_domain=args.trained_per_domain).to_list()]
    drafter = load_drafter("auto", target, target_name="smollm2-135m")
    spec = VARIANTS[args.variant]
    opd = AdaFlashOPD(target, drafter, OPDConfig(**{k: v for k, v in spec.items() if not k.startswith("_")}))
    if spec.get("_full"):
        for param in opd.train_model.parameters():
            param.requires_grad_(True)
        opd._optimizer = opd._new_optimizer()
    while opd._retention_text:
        opd._build_retention()

    def retention(all_anchors: bool) -> float:
        saved = opd.config.num_anchors
        opd.config.num_anchors = 1000 if all_anchors else saved
        try:
            return opd.held_out_tau(trajectories=opd.retention_set)[0]
        finally:
            opd.config.num_anchors = saved

    base = copy.deepcopy(opd.train_model).to(torch.bfloat16).eval()
    print(f"retention τ (16 anchors) {retention(False):.4f}, (all anchors) {retention(True):.4f}", flush=True)
    before = {"fiction": engine_tau(target, base, tokenizer, fiction), "trained": engine_tau(target, base, tokenizer, trained),
              "tf": opd.held_out_tau(trajectories=held_out)[0]}
    print(f"before: engine τ fiction {before['fiction']:.3f} trained {before['trained']:.3f}, teacher-forced fiction {before['tf']:.3f}", flush=True)
    generator = torch.Generator().manual_seed(0)
    tick = time.perf_counter()
    for _ in range(args.steps):
        picks = torch.randperm(len(train), generator=generator)[: opd.config.batch_trajectories].tolist()
        opd._guarded_step(opd.with_rehearsal([train[i] for i in picks], generator))
    seconds = time.perf_counter() - tick
    print(f"after: retention τ (16 anchors) {retention(False):.4f}, (all anchors) {retention(True):.4f}", flush=True)
    trained_model = copy.deepcopy(opd.train_model).to(torch.bfloat16).eval()
    after = {"fiction": engine_tau(target, trained_model, tokenizer, fiction), "trained": engine_tau(target, trained_model, tokenizer, trained),
             "tf": opd.held_out_tau(trajectories=held_out)[0]}
    print(f"after {args.steps} steps ({seconds:.0f} s, {args.variant}): engine τ fiction {after['fiction']:.3f} "
          f"({after['fiction'] / before['fiction'] - 1:+.1%}) trained {after['trained']:.3f} ({after['trained'] / before['trained'] - 1:+.1%}), "
          f"teacher-forced fiction {after['tf']:.3f} ({after['tf'] / before['tf'] - 1:+.1%})", flush=True)


if __name__ == "__main__":
    main()
