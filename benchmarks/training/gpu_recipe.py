"""Train a drafter at GPU scale in one bounded command: more data, then several layers and a large batch.

On a machine with one or more GPUs (no network needed once the target is on disk):

    python benchmarks/training/gpu_recipe.py --target smollm2-135m --data-dir data/smollm2-135m \\
        --output-dir runs/gpu --minutes 9 --export-dir exported

1. **Data** (``--generate-minutes``): ``adaflash generate-data`` answers the training prompts greedily (finished
   shards are kept, so cached answers cost nothing), then adds ``--samples-per-prompt`` sampled answers per
   prompt at ``--temperature``, in large batches.
2. **Training** (the rest of ``--minutes``, less a reserve for the final evaluation and saving): ``adaflash
   train-drafter`` on every cached response (``--self-gen-cached-only``) and teacher-forced corpus text, with
   ``--num-layers`` layers, blocks of ``--block-size``, ``--batch-size`` sequences per step; under ``accelerate
   launch`` (data-parallel) when several GPUs are visible. A rerun with the same output folder resumes from the
   latest checkpoint, optimizer and schedule included.
3. **Export** (``--export-dir``): the trained drafter (bf16), its ``metrics.jsonl``, training curves and this
   recipe's record, as one tar archive split into parts of at most ``--max-file-mib`` MiB for size-limited
   transfers; ``cat drafter.tar.part-* | tar -x -C DEST`` restores them.

Everything the run did (commands, minutes per phase, devices, data sizes, final held-out τ) is written to
``OUTPUT_DIR/recipe.json``. Arguments after ``--`` go to ``train-drafter`` unchanged. On a CPU the same script runs
(slowly); the test suite runs it with a tiny model.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

RESERVE_MINUTES = 1.5  # the final held-out evaluation, the bf16 save and the export, after the training loop


def devices() -> dict:
    """What this machine trains on."""
    import torch

    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        return {"kind": "cuda", "count": len(names), "names": names, "torch": torch.__version__}
    return {"kind": "cpu", "count": 1, "names": [], "threads": torch.get_num_threads(), "torch": torch.__version__}


def run(argv: list[str], log: list[dict]) -> float:
    """Run one command, streaming its output; record it with its minutes; stop the recipe if it fails."""
    print("+ " + " ".join(argv), flush=True)
    start = time.perf_counter()
    code = subprocess.run(argv).returncode
    minutes = (time.perf_counter() - start) / 60
    log.append({"command": argv, "minutes": round(minutes, 3), "returncode": code})
    if code != 0:
        raise SystemExit(f"error: the command above failed with exit code {code}; rerun the recipe to resume.")
    return minutes


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "adaflash_hf.cli", *args]


def export(output_dir: Path, export_dir: Path, max_file_mib: float, with_data: Path | None) -> list[str]:
    """Pack the drafter, its metrics, curves and the recipe record into ``drafter.tar.part-NN`` files."""
    run_dir = output_dir / "run"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(run_dir / "drafter", arcname="drafter")
        for name in ("metrics.jsonl", "curves.png"):
            if (run_dir / name).exists():
                tar.add(run_dir / name, arcname=name)
        tar.add(output_dir / "recipe.json", arcname="recipe.json")
        if with_data is not None:
            tar.add(with_data / "train", arcname="data/train")
    data = buffer.getvalue()
    export_dir.mkdir(parents=True, exist_ok=True)
    for old in export_dir.glob("drafter.tar.part-*"):
        old.unlink()
    size = max(1, int(max_file_mib * 2**20))
    names = []
    for i in range(0, len(data), size):
        name = f"drafter.tar.part-{i // size:02d}"
        (export_dir / name).write_bytes(data[i : i + size])
        names.append(name)
    return names


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="smollm2-135m", help="Preset name, local folder, .gguf file or Hub id.")
    parser.add_argument("--data-dir", required=True, help="generate-data folder (cached answers are reused).")
    parser.add_argument("--output-dir", required=True, help="Training output (checkpoints, metrics, drafter).")
    parser.add_argument("--minutes", type=float, default=9.0, help="Wall-clock budget of the whole recipe.")
    parser.add_argument("--generate-minutes", type=float, default=2.0, help="Of --minutes, for data (0: none).")
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--samples-per-prompt", type=int, default=4)
    parser.add_argument("--gen-batch-size", type=int, default=256)
    parser.add_argument("--prompts-per-domain", type=int, default=10000)
    parser.add_argument("--train-domains", nargs="+", default=["code", "math", "chat"])
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--target-dtype", default="auto", choices=["auto", "bf16", "fp16", "fp32"])
    parser.add_argument("--num-layers", type=int, default=3)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=64, help="Sequences per step, over all GPUs.")
    parser.add_argument("--num-anchors", type=int, default=128)
    parser.add_argument("--lr", type=float, default=6e-4)
    parser.add_argument("--warmup-steps", type=int, default=100)
    parser.add_argument("--corpus-fraction", type=float, default=0.3)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument("--export-dir", default=None, help="Where the packed drafter.tar.part-NN files go.")
    parser.add_argument("--max-file-mib", type=float, default=15.0, help="Largest exported part, in MiB.")
    parser.add_argument("--export-data", action="store_true", help="Also pack the cached answers (token ids).")
    args = parser.parse_args(argv)
    if args.generate_minutes >= args.minutes - RESERVE_MINUTES:
        parser.error(
            f"--generate-minutes {args.generate_minutes} leaves no training time within --minutes {args.minutes} "
            f"(the final evaluation and export keep {RESERVE_MINUTES}): lower it or raise --minutes"
        )

    start = time.perf_counter()
    output_dir, data_dir = Path(args.output_dir), Path(args.data_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    hardware = devices()
    print(f"devices: {hardware}", flush=True)
    log: list[dict] = []
    common = ["--target", args.target, "--target-dtype", args.target_dtype, "--data-dir", str(data_dir)]
    gen = [
        *common,
        "--train-domains",
        *args.train_domains,
        "--prompts-per-domain",
        str(args.prompts_per_domain),
        "--max-new-tokens",
        str(args.max_new_tokens),
        "--batch-size",
        str(args.gen_batch_size),
    ]

    # 1. Data: greedy answers (kept when cached), then sampled ones, within the data budget.
    if args.generate_minutes > 0:
        spent = run(cli("generate-data", *gen, "--max-minutes", f"{args.generate_minutes:.3f}"), log)
        left = args.generate_minutes - spent
        if left > 0.05 and args.samples_per_prompt > 0:
            sampled = ["--temperature", str(args.temperature), "--samples-per-prompt", str(args.samples_per_prompt)]
            run(cli("generate-data", *gen, *sampled, "--max-minutes", f"{left:.3f}"), log)

    # 2. Training, data-parallel over the GPUs, until the budget less the reserve.
    elapsed = (time.perf_counter() - start) / 60
    train_minutes = args.minutes - elapsed - RESERVE_MINUTES
    if train_minutes <= 0:
        raise SystemExit(f"error: data took {elapsed:.1f} of {args.minutes} minutes; nothing is left for training.")
    train = [
        "train-drafter",
        "--output-dir",
        str(output_dir / "run"),
        *common,
        "--self-gen-cached-only",
        "--train-domains",
        *args.train_domains,
        "--gen-max-new-tokens",
        str(args.max_new_tokens),
        "--num-layers",
        str(args.num_layers),
        "--block-size",
        str(args.block_size),
        "--batch-size",
        str(args.batch_size),
        "--num-anchors",
        str(args.num_anchors),
        "--lr",
        str(args.lr),
        "--warmup-steps",
        str(args.warmup_steps),
        "--corpus-fraction",
        str(args.corpus_fraction),
        "--max-steps",
        "1000000",
        "--max-minutes",
        f"{train_minutes:.3f}",
        "--eval-every",
        str(args.eval_every),
        "--checkpoint-every",
        str(args.checkpoint_every),
        "--engine-eval-prompts",
        "0",
        *extra,
    ]
    if hardware["kind"] == "cuda" and hardware["count"] > 1:
        launch = ["accelerate", "launch", "--multi_gpu", "--num_processes", str(hardware["count"])]
        launch += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "adaflash_hf.cli"]
        run(launch + train, log)
    else:
        run(cli(*train), log)

    # 3. The record, then the export.
    summary_path = output_dir / "run" / "drafter" / "training_summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    record = {
        "recipe": vars(args) | {"train_drafter_extra": extra},
        "devices": hardware,
        "commands": log,
        "minutes": round((time.perf_counter() - start) / 60, 3),
        "held_out_at_init": (summary.get("held_out_at_init") or {}).get("tau"),
        "held_out_final": (summary.get("held_out_teacher_forced") or {}).get("tau"),
        "data": summary.get("data_sizes"),
        "steps": summary.get("steps"),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    (output_dir / "recipe.json").write_text(json.dumps(record, indent=1))
    print(f"held-out tau: {record['held_out_at_init']} at the start, {record['held_out_final']} at the end")
    if args.export_dir:
        names = export(output_dir, Path(args.export_dir), args.max_file_mib, data_dir if args.export_data else None)
        shutil.copy(output_dir / "recipe.json", Path(args.export_dir) / "recipe.json")
        print(f"exported {', '.join(names)} to {args.export_dir}: cat drafter.tar.part-* | tar -x -C DEST")
    return 0


if __name__ == "__main__":
    sys.exit(main())
