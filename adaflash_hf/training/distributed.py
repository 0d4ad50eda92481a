"""Drafter training over several processes (``accelerate launch``): data-parallel, and equal to one process.

``--batch-size`` is the global batch: every process draws the same sequences from the same seeded generator,
samples the anchors of every row (so the generator advances exactly as in one process) and keeps its own equal
slice of the rows. DDP averages the gradients, and :func:`.step.drafter_block_forward` divides each process's
weighted loss sum by the batch's mean loss weight per process, so the average is the gradient of the whole
batch's loss: N processes train the drafter one process trains with the same global batch, up to float
rounding. Only the main process evaluates, logs, plots and writes checkpoints; every process resumes from the
same checkpoint.
"""

from __future__ import annotations

import logging
import os

import torch
from accelerate import Accelerator
from accelerate.utils import broadcast

from .data import Batch

logger = logging.getLogger(__name__)


def process_rows(batch_size: int, num_processes: int, process_index: int) -> slice:
    """The rows of each global batch that process ``process_index`` trains on; refuses an uneven split."""
    if batch_size % num_processes:
        raise ValueError(
            f"batch_size {batch_size} is the global batch and must divide evenly among the {num_processes} "
            f"processes: pass a multiple of {num_processes} (each process then trains on batch_size / "
            f"{num_processes} sequences)."
        )
    per_process = batch_size // num_processes
    return slice(process_index * per_process, (process_index + 1) * per_process)


def rows_of(batch: Batch, rows: slice) -> Batch:
    """The rows ``rows`` of a batch (views, same width)."""
    return Batch(batch.input_ids[rows], batch.attention_mask[rows], batch.label_mask[rows])


class Processes:
    """What the training loop needs from the other processes; plain values when it runs alone."""

    def __init__(self, accelerator: Accelerator):
        self.accelerator = accelerator
        self.count = accelerator.num_processes
        self.is_main = accelerator.is_main_process
        # `accelerate launch --cpu --num_processes N>1` sets these and starts one process (MPI is its way to more)
        cpu_launch = os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true") and "MASTER_PORT" in os.environ
        if self.count == 1 and cpu_launch:
            logger.warning(
                "accelerate launch --cpu started this single process: without an MPI host file it runs one "
                "process whatever --num_processes says. On a machine without GPUs, launch with --multi_gpu "
                "--num_processes N instead (accelerate then trains on the CPU over gloo)."
            )

    def mean_fn(self):
        """A tensor's mean over the processes, for :func:`.step.drafter_block_forward`; None when alone."""
        return None if self.count == 1 else self.mean

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """``value`` averaged over the processes (itself when alone)."""
        return value if self.count == 1 else self.accelerator.reduce(value, "mean")

    def mean_of_all(self, values: torch.Tensor) -> float:
        """The mean of the elements of every process's ``values`` together."""
        if self.count == 1:
            return float(values.float().mean())
        device = self.accelerator.device
        pooled = torch.tensor([float(values.sum()), values.numel()], dtype=torch.float64, device=device)
        total, count = self.accelerator.reduce(pooled, "sum").tolist()
        return total / max(count, 1)

    def main_value(self, value: float) -> float:
        """The main process's ``value`` on every process (a clock reading, so that all stop at the same step)."""
        if self.count == 1:
            return value
        return float(broadcast(torch.tensor([value], dtype=torch.float64, device=self.accelerator.device))[0])
