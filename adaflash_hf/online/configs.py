"""Options of on-line distillation, torch-free so that ``adaflash bench-opd --help`` and the CLI can read them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class OPDConfig:
    """Knobs of on-line distillation. Defaults follow AdaFlash's recipe where it has one."""

    alpha: float = field(
        default=0.8, metadata={"help": "Weight of CE on the target's argmax; 1 - alpha goes to the clipped reverse KL."}
    )
    clip: float = field(
        default=0.01, metadata={"help": "Entry-wise clip of the reverse KL (a clipped entry has no gradient)."}
    )
    lr: float = field(default=1e-3, metadata={"help": "AdamW learning rate of the LoRA weights."})
    lora_rank: int = field(default=64, metadata={"help": "LoRA rank."})
    lora_alpha: float | None = field(default=None, metadata={"help": "LoRA alpha (default: twice the rank)."})
    min_trajectories: int = field(default=8, metadata={"help": "Trajectories to collect before training starts."})
    batch_trajectories: int = field(default=8, metadata={"help": "Live trajectories per training batch."})
    passes: int = field(
        default=1,
        metadata={"help": "Optimizer steps per batch (AdaFlash: 2 passes per buffer batch; with replay, one)."},
    )
    num_anchors: int = field(
        default=16,
        metadata={"help": "Blocks sampled per trajectory per step (few per trajectory, more trajectories per step)."},
    )
    loss_positions: int | None = field(
        default=None, metadata={"help": "Block positions with a loss (default: the whole block)."}
    )
    gamma: float | None = field(
        default=None, metadata={"help": "Position decay constant (default: 7 for blocks of 16, 4 for 8)."}
    )
    rejected_weight: float = field(
        default=2.0, metadata={"help": "Loss weight of positions where verification rejected a drafter draft."}
    )
    steps_per_version: int = field(
        default=8, metadata={"help": "Training steps between acceptance checks / publications."}
    )
    check_every: int = field(
        default=4, metadata={"help": "Every n-th trajectory is held out for the acceptance check, not trained on."}
    )
    check_size: int = field(default=16, metadata={"help": "Held-out trajectories kept for the check (the newest)."})
    retention_trajectories: int = field(
        default=16,
        metadata={
            "help": (
                "Trajectories of the drafter's own training domains (its datastore: the target's responses to "
                "its training prompts, teacher-forced through the target once) on which a candidate may lose at "
                "most max_retention_drop of the base drafter's τ, or it is not published; 0: no such check."
            )
        },
    )
    max_retention_drop: float = field(
        default=0.02,
        metadata={
            "help": (
                "Largest relative τ loss on the retention trajectories a published version may have against the "
                "base drafter."
            )
        },
    )
    rehearsal_trajectories: int = field(
        default=4,
        metadata={
            "help": (
                "Trajectories of the drafter's training domains (other datastore responses than the retention "
                "check's) mixed into every training batch, against forgetting them; 0: none."
            )
        },
    )
    min_improvement: float = field(
        default=0.0, metadata={"help": "Publish only when held-out tau beats the serving version by at least this."}
    )
    duty_cycle: float = field(
        default=0.25,
        metadata={"help": "Share of wall time the trainer may compute (it sleeps the rest); 1 = no limit."},
    )
    worker: str = field(
        default="auto",
        metadata={
            "help": (
                "Where training runs: 'inline' (in the engine's thread between rounds, under the duty cycle, and "
                "whenever the engine is idle), 'thread' (a background thread with train_threads threads), 'auto' "
                "(inline on a CPU, thread on an accelerator)."
            )
        },
    )
    train_threads: int = field(
        default=1,
        metadata={"help": "torch threads of the training thread (worker 'thread'; inline training uses the engine's)."},
    )
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping."})
    top_k: int = field(default=32, metadata={"help": "Teacher entries kept per generated token."})
    buffer_trajectories: int = field(
        default=256, metadata={"help": "Buffer bound in trajectories (the oldest are dropped)."}
    )
    replay_trajectories: int = field(
        default=64,
        metadata={
            "help": (
                "Trained trajectories kept (the newest) and revisited when no new one waits, so idle trainer "
                "time becomes more passes; 0: each is trained on once."
            )
        },
    )
    buffer_mb: int = field(default=512, metadata={"help": "Buffer bound in MiB."})
    publish_dir: str | None = field(
        default=None, metadata={"help": "Also write each published version here (v000N/ + LATEST)."}
    )
    max_restarts: int = field(default=3, metadata={"help": "Times check_health() restarts a dead worker."})
    seed: int = field(default=0, metadata={"help": "Seed of anchor sampling."})

    def __post_init__(self) -> None:
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {self.alpha}.")
        if not 0.0 < self.duty_cycle <= 1.0:
            raise ValueError(f"duty_cycle must be in (0, 1], got {self.duty_cycle}.")
        if self.retention_trajectories < 0 or self.rehearsal_trajectories < 0:
            raise ValueError(
                f"retention_trajectories and rehearsal_trajectories must be >= 0, got {self.retention_trajectories} "
                f"and {self.rehearsal_trajectories}."
            )
        if self.lora_alpha is None:
            self.lora_alpha = 2.0 * self.lora_rank
        if not 0.0 <= self.max_retention_drop < 1.0:
            raise ValueError(f"max_retention_drop must be in [0, 1), got {self.max_retention_drop}.")
        for name in (
            "min_trajectories",
            "batch_trajectories",
            "passes",
            "num_anchors",
            "steps_per_version",
            "check_every",
            "check_size",
            "train_threads",
            "top_k",
            "buffer_trajectories",
            "buffer_mb",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")
        if self.worker not in ("auto", "inline", "thread"):
            raise ValueError(f"worker must be 'auto', 'inline' or 'thread', got {self.worker!r}.")
        if self.replay_trajectories < 0:
            raise ValueError(f"replay_trajectories must be >= 0, got {self.replay_trajectories}.")
        if self.lr <= 0 or self.clip <= 0:
            raise ValueError(f"lr and clip must be > 0, got lr={self.lr}, clip={self.clip}.")
