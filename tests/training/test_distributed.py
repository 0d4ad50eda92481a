"""Training over several processes: ``accelerate launch`` of two CPU processes (DDP over gloo) trains the drafter
that one process trains with the same global batch.

The test runs the same training in three legs (train; resume from the checkpoint and train on; resume again and
train from a feature cache) in this process and, through ``accelerate launch --multi_gpu --num_processes 2`` with no
GPU visible, in two processes; this file is also the script those processes run.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from accelerate.utils import extract_model_from_parallel
from test_training import TINY_RUN, chat_target

import adaflash_hf.training.trainer as trainer_module
from adaflash_hf import targets
from adaflash_hf.training import TrainDrafterConfig, train_drafter
from adaflash_hf.training.features import build_feature_cache

LEGS = (2, 4, 6)  # max_steps of the first run and of the resumed ones; the last reads a feature cache
ROOT = Path(__file__).resolve().parents[2]


def _config(output_dir: str | Path, max_steps: int, feature_cache: Path | None) -> TrainDrafterConfig:
    return TrainDrafterConfig(
        output_dir=str(output_dir),
        **TINY_RUN,
        corpus_fraction=0.0 if feature_cache else 0.5,  # corpus and self-generated text (by the main process)
        corpus_limit_per_domain=4,
        self_gen_prompts_per_domain=4,
        eval_prompts_per_domain=2,
        gen_max_new_tokens=8,
        gen_batch_size=4,
        eval_anchors=4,
        eval_every=2,
        checkpoint_every=2,
        warmup_steps=1,
        engine_eval_prompts=0,
        distill_weight=0.0 if feature_cache else 0.5,  # CE and KL, each normalised over the global batch
        feature_cache=None if feature_cache is None else str(feature_cache),
        batch_size=4,  # the global batch: 2 sequences per process
        grad_accum=2,
        max_steps=max_steps,
        num_threads=1,
    )


def train_legs(output_dir: Path, cache: Path) -> dict:
    """Train the legs (the last from the feature cache ``cache``, built from the first run's responses unless it
    exists); return the loss of every training micro-batch (this process's share), and the initial and final
    weights of this process's drafter (fp32, except the main process's, cast to bf16 when saved)."""
    losses, drafters = [], []
    real = trainer_module.drafter_block_forward

    def recording(drafter, *args, **kwargs):
        raw = extract_model_from_parallel(drafter)
        if not drafters or drafters[-1][0] is not raw:
            drafters.append((raw, {k: v.detach().clone() for k, v in raw.state_dict().items()}))
        out = real(drafter, *args, **kwargs)
        if drafter.training:  # the main process's held-out evaluations run in eval mode
            losses.append(float(out.loss.detach()))
        return out

    trainer_module.drafter_block_forward = recording
    threads, bf16_is_faster = torch.get_num_threads(), targets._cpu_bf16_is_faster
    targets._cpu_bf16_is_faster = lambda: False  # fp32 compute, whatever the CPU
    try:
        for max_steps in LEGS:
            target, tokenizer = chat_target(layers=4)
            last = max_steps == LEGS[-1]
            if last and not (cache / "meta.json").exists():
                build_feature_cache(target, tokenizer, output_dir / "data", cache, [0, 1, 2, 3], "tiny")
            train_drafter(_config(output_dir, max_steps, cache if last else None), target, tokenizer)
    finally:
        trainer_module.drafter_block_forward = real
        torch.set_num_threads(threads)
        targets._cpu_bf16_is_faster = bf16_is_faster
    final = {k: v.detach().clone() for k, v in drafters[-1][0].state_dict().items()}
    return {"losses": losses, "initial": drafters[0][1], "final": final}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _checkpoint(output_dir: Path) -> dict[str, torch.Tensor]:
    path = output_dir / "checkpoints" / f"step_{LEGS[-1]}" / "checkpoint.pt"
    return torch.load(path, weights_only=False)["drafter"]


def _distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return float(torch.cat([(a[k].float() - b[k].float()).flatten() for k in a]).norm())


def test_two_processes_train_the_drafter_one_process_trains_with_the_same_global_batch(tmp_path):
    cache = tmp_path / "features"
    one = train_legs(tmp_path / "one", cache)  # this process alone

    two_dir = tmp_path / "two"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    command += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    command += ["--main_process_port", str(_free_port()), __file__, str(two_dir), str(cache)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [torch.load(two_dir / f"rank{r}.pt", weights_only=False) for r in (0, 1)]

    # (a) each process's loss is its share of the global batch's loss: their mean is the one process's loss (measured:
    # within 2e-7 relative; 8e-4 apart when the gradients are not all-reduced)
    assert len(ranks[0]["losses"]) == len(ranks[1]["losses"]) == len(one["losses"]) == 2 * LEGS[-1]
    two_losses = [(a + b) / 2 for a, b in zip(ranks[0]["losses"], ranks[1]["losses"])]
    torch.testing.assert_close(torch.tensor(two_losses), torch.tensor(one["losses"]), rtol=1e-5, atol=0)
    assert ranks[0]["losses"] != ranks[1]["losses"]  # the processes trained on different rows

    # (b) DDP keeps the processes' drafters identical: rank 1's weights are those rank 0 checkpointed
    checkpoint = _checkpoint(two_dir)
    for name, value in checkpoint.items():
        assert torch.equal(value, ranks[1]["final"][name]), name

    # (c) and they are the one process's (measured: 4e-7 of how far training moved them; without the all-reduce 44%,
    # 97% of the elements off by more than 1e-5)
    one_final = _checkpoint(tmp_path / "one")
    assert _distance(one_final, one["initial"]) > 0.1  # training moved them
    for name, value in one_final.items():
        torch.testing.assert_close(checkpoint[name], value, rtol=1e-4, atol=1e-5, msg=name)

    # only the main process evaluated and logged: the same records as one process, and the same held-out losses
    one_evals, two_evals = (
        [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        for folder in (tmp_path / "one", two_dir)
    )
    assert [(r["kind"], r["step"]) for r in two_evals] == [(r["kind"], r["step"]) for r in one_evals]
    torch.testing.assert_close(
        torch.tensor([r["loss"] for r in two_evals]), torch.tensor([r["loss"] for r in one_evals]), rtol=1e-4, atol=0
    )
    for step in LEGS[:-1]:  # both processes resumed from the checkpoint of each earlier leg
        assert done.stderr.count(f"(step {step})") == 2


def test_a_global_batch_that_does_not_divide_among_the_processes_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(trainer_module.Accelerator, "num_processes", property(lambda self: 2))
    with pytest.raises(ValueError, match="batch_size 3 is the global batch and must divide evenly among the 2"):
        train_drafter(TrainDrafterConfig(output_dir=str(tmp_path), batch_size=3))  # before any model loads


if __name__ == "__main__":  # one process of the launch above
    logging.basicConfig(level=logging.INFO)
    folder = Path(sys.argv[1])
    assert trainer_module.__file__.startswith(str(ROOT)), trainer_module.__file__  # this checkout's package
    record = train_legs(folder, Path(sys.argv[2]))
    torch.save(record, folder / f"rank{os.environ['RANK']}.pt")
