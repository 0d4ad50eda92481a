"""Drafter training throughput: supervised predictions per CPU-second with a live target forward per step
against cached target features (``adaflash cache-features``), beside a FLOP estimate of the step and this
CPU's measured bf16 matmul rate, so the table says how far from the machine's limit training runs.

Both modes train the same drafter recipe on the same sequences and anchors, alternating step by step so
machine noise hits both alike. Run on an idle machine:

    python benchmarks/training/throughput.py --feature-cache ~/.cache/adaflash_hf/features/smollm2-135m-L1_8_15_22_27

It prints a table and writes ``benchmarks/training/throughput.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def provenance() -> dict:
    """What produced the JSON, where and when (``committed_in`` is added when the JSON is committed)."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True).stdout
    import torch

    from adaflash_hf.provenance import machine_summary

    return {
        "command": "python benchmarks/training/throughput.py " + " ".join(sys.argv[1:]),
        "machine": f"{machine_summary()}, {torch.get_num_threads()} torch threads, idle",
        "code_commit": commit.strip() or "unknown",
        "date": time.strftime("%Y-%m-%d"),
    }


def matmul_tflops(size: int = 2048, repeats: int = 5) -> float:
    """Measured bf16 matmul rate of this CPU (TFLOP/s), best of ``repeats``."""
    import torch

    a = torch.randn(size, size, dtype=torch.bfloat16)
    b = torch.randn(size, size, dtype=torch.bfloat16)
    a @ b  # warm-up: oneDNN picks and caches its kernel
    best = float("inf")
    for _ in range(repeats):
        tick = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - tick)
    return 2 * size**3 / best / 1e12


def step_flops(config, seq_len: int, num_blocks: int, supervised: int, draft_vocab: int) -> float:
    """Forward + backward FLOPs of one drafter step (matmuls only; backward = 2x forward for trained weights).

    Per layer: q/o projections and the MLP on the blocks' tokens, k/v projections on context + blocks,
    attention scores and values over context + blocks; fc on the context; the frozen lm_head rows of the
    draft vocabulary on supervised positions (its backward computes input gradients only: 1x).
    """
    h, inter = config.hidden_size, config.intermediate_size
    q_dim = config.num_attention_heads * config.head_dim
    kv_dim = config.num_key_value_heads * config.head_dim
    block_tokens = num_blocks * config.block_size
    keys = seq_len + block_tokens
    per_layer = 2 * block_tokens * (h * q_dim + q_dim * h + 3 * h * inter) + 2 * keys * 2 * h * kv_dim
    per_layer += 2 * 2 * block_tokens * keys * q_dim  # scores and weighted values (dense, as SDPA computes them)
    trained = config.num_hidden_layers * per_layer + 2 * seq_len * len(config.target_layer_ids) * h * h
    head = 2 * supervised * h * draft_vocab
    return 3 * trained + 2 * head


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--feature-cache", required=True, help="Folder written by adaflash cache-features.")
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--steps", type=int, default=20, help="Timed steps per mode (after 3 warm-up steps).")
    parser.add_argument("--num-layers", type=int, default=1)
    parser.add_argument("--block-size", type=int, default=8)
    parser.add_argument("--num-anchors", type=int, default=64)
    parser.add_argument("--draft-vocab-size", type=int, default=4096)
    parser.add_argument("--num-threads", type=int, default=2)
    parser.add_argument("--output", default=str(HERE / "throughput.json"))
    args = parser.parse_args()

    import torch

    from adaflash_hf.modeling_adaflash import AdaFlashDrafter
    from adaflash_hf.targets import load_target
    from adaflash_hf.training.anchors import sample_anchors
    from adaflash_hf.training.data import IGNORE_INDEX, collate, target_features
    from adaflash_hf.training.features import FeatureStore
    from adaflash_hf.training.losses import default_gamma, position_weights
    from adaflash_hf.training.step import compute_autocast, drafter_block_forward
    from adaflash_hf.training.vocab import most_frequent, response_token_counts

    torch.set_num_threads(args.num_threads)
    target, tokenizer = load_target(args.target, dtype="bf16")
    target.requires_grad_(False)
    store = FeatureStore(args.feature_cache)
    store.check(args.target, store.layer_ids)
    pad_id = tokenizer.pad_token_id
    torch.manual_seed(0)
    drafter = AdaFlashDrafter.from_target(
        target, args.num_layers, args.block_size, target_layer_ids=store.layer_ids, mask_token_id=16
    ).float()
    sample = [store.training_sequence(i) for i in range(0, len(store), max(1, len(store) // 500))]
    drafter.set_draft_vocab(
        most_frequent(
            response_token_counts(sample),
            args.draft_vocab_size,
            drafter.config.vocab_size,
            always=[tokenizer.eos_token_id],
        )
    )
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=1e-4)
    weights = position_weights(args.block_size, default_gamma(args.block_size))
    picks = torch.randint(len(store), (args.steps + 3,), generator=torch.Generator().manual_seed(0)).tolist()

    def step(index: int, cached: bool) -> dict:
        cpu, wall = time.process_time(), time.perf_counter()
        if cached:
            batch, features = store.batch([index], pad_id)
            features.context = features.context.float()
        else:
            batch = collate([store.training_sequence(index)], pad_id)
            features = target_features(target, batch, store.layer_ids)
        feature_cpu = time.process_time() - cpu
        anchors, valid = sample_anchors(batch.label_mask, args.num_anchors, torch.Generator().manual_seed(index))
        with compute_autocast("cpu", target.dtype):
            out = drafter_block_forward(drafter, target, batch, features, anchors, valid, weights, True)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        supervised = int((out.labels != IGNORE_INDEX).sum())
        return {
            "cpu_s": time.process_time() - cpu,
            "wall_s": time.perf_counter() - wall,
            "feature_cpu_s": feature_cpu,
            "supervised": supervised,
            "seq_len": batch.input_ids.shape[1],
            "blocks": int(valid.sum()),
        }

    records = {"live": [], "cached": []}
    for n, index in enumerate(picks):
        for mode in ("live", "cached") if n % 2 == 0 else ("cached", "live"):
            record = step(index, mode == "cached")
            if n >= 3:
                records[mode].append(record)

    peak = matmul_tflops()
    rows = {}
    for mode, recs in records.items():
        cpu = sum(r["cpu_s"] for r in recs)
        flops = sum(
            step_flops(drafter.config, r["seq_len"], r["blocks"], r["supervised"], args.draft_vocab_size) for r in recs
        )
        drafter_cpu = sum(r["cpu_s"] - r["feature_cpu_s"] for r in recs)
        rows[mode] = {
            "supervised_per_cpu_s": sum(r["supervised"] for r in recs) / cpu,
            "supervised_per_wall_s": sum(r["supervised"] for r in recs) / sum(r["wall_s"] for r in recs),
            "feature_share": sum(r["feature_cpu_s"] for r in recs) / cpu,
            "drafter_tflops_per_core": flops / drafter_cpu / 1e12,
            "steps": recs,
        }
    speedup = rows["cached"]["supervised_per_cpu_s"] / rows["live"]["supervised_per_cpu_s"]
    per_core_peak = peak / args.num_threads
    print(
        f"| features | supervised predictions / CPU-s | / wall-s | features' share of CPU | drafter TFLOP/s per core "
        f"(peak {per_core_peak:.3f}) |"
    )
    print("|---|---|---|---|---|")
    for mode, row in rows.items():
        print(
            f"| {mode} | {row['supervised_per_cpu_s']:.0f} | {row['supervised_per_wall_s']:.0f} | "
            f"{row['feature_share']:.0%} | {row['drafter_tflops_per_core']:.3f} "
            f"({row['drafter_tflops_per_core'] / per_core_peak:.0%}) |"
        )
    print(f"cached / live: {speedup:.2f}x supervised predictions per CPU-second")
    result = {
        "provenance": provenance(),
        "recipe": vars(args),
        "matmul_bf16_tflops": peak,
        "cached_over_live": speedup,
        "modes": rows,
        "cache": {"tokens": store.num_tokens, "bytes": store.size_bytes},
    }
    Path(args.output).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
