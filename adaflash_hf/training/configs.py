"""The configs of the training commands, light on purpose (no torch or transformers at import).

``adaflash train-drafter`` and ``train-length-head`` build their options from these dataclasses, so
``adaflash <command> --help`` loads this module only; the modules that run the commands (:mod:`.trainer`,
:mod:`.length_head`) import torch and re-export their config from here. The data commands' configs live in
:mod:`.data_configs`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..cli_args import (
    DRAFTER_HELP,
    DTYPES,
    check_choice,
    drafter_field,
    dtype_field,
    num_threads_field,
    seed_field,
    target_field,
)

CONTEXT_LAYERS = 5  # target layers a drafter reads by default, however many draft layers it has


@dataclass
class TrainDrafterConfig:
    """Recipe of one drafter training run. Every field has a default except ``output_dir``."""

    output_dir: str = field(metadata={"help": "Folder for data cache, checkpoints, metrics and the final drafter."})
    target: str = target_field("smollm2-135m")
    target_dtype: str = dtype_field("the frozen target")
    num_layers: int = field(default=1, metadata={"help": "Number of draft layers."})
    intermediate_size: int | None = field(
        default=None,
        metadata={
            "help": "MLP width of the draft layers (default: the target's; smaller keeps big-target drafters small)."
        },
    )
    block_size: int = field(default=8, metadata={"help": "Tokens per draft block (anchor + block_size - 1 masks)."})
    target_layer_ids: list[int] | None = field(
        default=None,
        metadata={
            "help": f"Target layers read as context (default: {CONTEXT_LAYERS} layers spread from the first to the "
            f"fourth-last, DFlash's choice for a {CONTEXT_LAYERS}-layer drafter, also for fewer draft layers)."
        },
    )
    mask_token_id: int | None = field(
        default=None,
        metadata={"help": "Vocabulary row used as MASK (default: an unused special token of the tokenizer)."},
    )
    gamma: float | None = field(
        default=None, metadata={"help": "Position decay exp(-(k-1)/gamma) (default: 7 for block 16, 4 for block 8)."}
    )
    position_weighting: str = field(
        default="decay",
        metadata={
            "help": "How block positions are weighted in the training loss: 'decay' (exp(-(k-1)/gamma), DFlash) or "
            "'reach' (each block's own probability, under the drafter, of drafting positions 1..k-1 correctly). "
            "Held-out loss is always reported with the decay.",
            "choices": ("decay", "reach"),
        },
    )
    loss_positions: int | None = field(
        default=None,
        metadata={"help": "Supervise only block positions 1..loss_positions (default: all block_size - 1)."},
    )
    distill_weight: float = field(
        default=0.0,
        metadata={"help": "Weight of KL(p_target || p_draft) added to the CE on the target's argmax (0: CE only)."},
    )
    consistent_labels: bool = field(
        default=True,
        metadata={
            "help": "For teacher-forced text, drop block positions whose text prefix differs from the target's "
            "greedy tokens."
        },
    )
    num_anchors: int = field(default=64, metadata={"help": "Anchors (blocks) sampled per sequence per step."})
    seq_len: int = field(default=512, metadata={"help": "Length of packed corpus windows (tokens)."})
    batch_size: int = field(
        default=1,
        metadata={
            "help": "Sequences per micro-batch, over all processes: under accelerate launch each of N processes "
            "trains on batch_size / N of them."
        },
    )
    grad_accum: int = field(default=1, metadata={"help": "Micro-batches per optimizer step."})
    steps_per_forward: int = field(
        default=1,
        metadata={
            "help": "Micro-batches drawn from one target forward, each with fresh anchors (>1 amortises an expensive "
            "target)."
        },
    )
    lr: float = field(default=6e-4, metadata={"help": "Peak AdamW learning rate."})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay."})
    warmup_steps: int = field(default=20, metadata={"help": "Linear warmup steps; cosine decay to 10% follows."})
    max_steps: int = field(default=1000, metadata={"help": "Optimizer steps (the run also stops at max_minutes)."})
    max_minutes: float | None = field(
        default=None,
        metadata={
            "help": "Wall-clock budget of the training loop; the cosine follows whichever budget is nearer its end."
        },
    )
    eval_every: int = field(default=100, metadata={"help": "Steps between held-out evaluations."})
    checkpoint_every: int = field(
        default=100, metadata={"help": "Steps between checkpoints (the latest two are kept)."}
    )
    seed: int = seed_field("initialisation, data order and anchors")
    train_domains: list[str] = field(
        default_factory=lambda: ["code", "math", "chat"],
        metadata={"help": "Domains of training prompts and corpus text."},
    )
    corpus_fraction: float = field(
        default=0.8,
        metadata={
            "help": "Fraction of micro-batches from teacher-forced corpus text; the rest are self-generated responses."
        },
    )
    corpus_limit_per_domain: int | None = field(
        default=None, metadata={"help": "Cap on corpus text chunks per domain (None: all)."}
    )
    self_gen_prompts_per_domain: int = field(
        default=64, metadata={"help": "Training prompts per domain answered by the target (self-distillation)."}
    )
    eval_prompts_per_domain: int = field(default=16, metadata={"help": "Held-out prompts per domain for evaluation."})
    gen_max_new_tokens: int = field(default=192, metadata={"help": "Response length of self-generated sequences."})
    gen_batch_size: int = field(default=16, metadata={"help": "Batch size of self-generation."})
    eval_anchors: int = field(
        default=64, metadata={"help": "Anchors per held-out sequence in the teacher-forced evaluation."}
    )
    engine_eval_prompts: int = field(
        default=6, metadata={"help": "Held-out prompts decoded with the real engine at the end (0: skip)."}
    )
    data_dir: str | None = field(
        default=None,
        metadata={"help": "Cache of self-generated sequences, shareable between runs (default: output_dir/data)."},
    )
    num_threads: int | None = num_threads_field("; on shared CPUs, 1 avoids oversubscription stalls")
    resume: bool = field(
        default=True, metadata={"help": "Resume from the latest checkpoint in output_dir when one exists."}
    )
    init_from: str | None = field(
        default=None,
        metadata={
            "help": "Start from this drafter's weights and architecture ('auto': the bundled drafter of --target; or "
            "a folder / Hub id), so training compute adds up across runs. A checkpoint in output_dir still takes "
            "precedence."
        },
    )
    add_layers: int = field(
        default=0,
        metadata={
            "help": "Append this many fresh layers to the --init-from drafter, their output projections zeroed so "
            "the deeper drafter starts as the same function (and the same held-out tau) and learns from there."
        },
    )
    self_gen_cached_only: bool = field(
        default=False,
        metadata={
            "help": "Train on every self-generated response already cached under DATA_DIR/train (all prompt "
            "sets adaflash generate-data wrote: greedy, sampled, your own prompts), generating none."
        },
    )
    draft_vocab_size: int | None = field(
        default=None,
        metadata={
            "help": "Train (and ship) with a reduced draft vocabulary of the N most frequent tokens of the "
            "self-generated responses (default: keep the init drafter's, else the full vocabulary)."
        },
    )
    feature_cache: str | None = field(
        default=None,
        metadata={
            "help": "A cache of target features (adaflash cache-features): self-generated batches read their context "
            "and labels from it, so a step runs only the drafter."
        },
    )
    feature_cache_shards: int | None = field(
        default=None,
        metadata={
            "help": "Train on only the first N finished shards of --feature-cache, in name order (default: all), so a "
            "run can be repeated on the data an earlier run saw after the cache has grown."
        },
    )
    init_layers: str = field(
        default="random",
        metadata={
            "help": "How fresh draft layers start: 'random', or 'target' (copies of the target's layers above the "
            "deepest context layer, the context projection passing that layer through)."
        },
    )

    def __post_init__(self) -> None:
        positive = (
            "num_layers",
            "num_anchors",
            "batch_size",
            "grad_accum",
            "steps_per_forward",
            "max_steps",
            "eval_every",
            "checkpoint_every",
            "gen_max_new_tokens",
            "gen_batch_size",
            "eval_anchors",
            "eval_prompts_per_domain",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")
        if self.add_layers < 0:
            raise ValueError(f"add_layers must be >= 0, got {self.add_layers}.")
        if self.add_layers and self.init_from is None:
            raise ValueError(
                "add_layers grows a trained drafter: pass --init-from (a folder, a Hub id or 'auto'), or set "
                "--num-layers for a fresh one."
            )
        if self.block_size < 2:
            raise ValueError(f"block_size must be >= 2 (anchor + at least one mask), got {self.block_size}.")
        if self.gamma is None:
            from .losses import default_gamma  # imports torch: only when a config is built, never for --help

            self.gamma = default_gamma(self.block_size)
        if self.gamma <= 0:
            raise ValueError(f"gamma must be > 0, got {self.gamma}.")
        if self.loss_positions is not None and not 1 <= self.loss_positions <= self.block_size - 1:
            raise ValueError(
                f"loss_positions must be in [1, block_size - 1 = {self.block_size - 1}], got {self.loss_positions}."
            )
        if self.distill_weight < 0:
            raise ValueError(f"distill_weight must be >= 0, got {self.distill_weight}.")
        if not 0.0 <= self.corpus_fraction <= 1.0:
            raise ValueError(f"corpus_fraction must be in [0, 1], got {self.corpus_fraction}.")
        if self.corpus_fraction < 1.0 and self.self_gen_prompts_per_domain < 1:
            raise ValueError("corpus_fraction < 1 needs self-generated data: set self_gen_prompts_per_domain >= 1.")
        if self.lr <= 0 or self.weight_decay < 0:
            raise ValueError(
                f"lr must be > 0 and weight_decay >= 0, got lr={self.lr}, weight_decay={self.weight_decay}."
            )
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1 or None, got {self.num_threads}.")
        if self.warmup_steps < 0 or self.engine_eval_prompts < 0:
            raise ValueError("warmup_steps and engine_eval_prompts must be >= 0.")
        if self.max_minutes is not None and self.max_minutes <= 0:
            raise ValueError(f"max_minutes must be > 0 or None, got {self.max_minutes}.")
        if self.intermediate_size is not None and self.intermediate_size < 1:
            raise ValueError(f"intermediate_size must be >= 1 or None, got {self.intermediate_size}.")
        if self.seq_len < 2 * self.block_size:
            raise ValueError(f"seq_len ({self.seq_len}) must be at least 2 * block_size ({2 * self.block_size}).")
        check_choice("target_dtype", self.target_dtype, DTYPES)
        if not self.train_domains:
            raise ValueError("train_domains is empty.")
        check_choice("init_layers", self.init_layers, ("random", "target"))
        check_choice("position_weighting", self.position_weighting, ("decay", "reach"))
        if self.feature_cache is not None and not (Path(self.feature_cache) / "meta.json").exists():
            raise FileNotFoundError(
                f"feature_cache {self.feature_cache}: not a feature cache (no meta.json); build it with "
                "`adaflash cache-features`."
            )
        if self.feature_cache_shards is not None and (self.feature_cache is None or self.feature_cache_shards < 1):
            raise ValueError(
                f"feature_cache_shards {self.feature_cache_shards}: needs --feature-cache and a count >= 1."
            )
        if self.feature_cache is not None and self.distill_weight > 0:
            raise ValueError(
                "distill_weight > 0 needs the target's full logits, which a feature cache does not keep: "
                "drop --feature-cache or set --distill-weight 0."
            )
        if self.draft_vocab_size is not None and self.draft_vocab_size < 1:
            raise ValueError(f"draft_vocab_size must be >= 1 or None, got {self.draft_vocab_size}.")


@dataclass
class TrainLengthHeadConfig:
    """``adaflash train-length-head``: record acceptance with the real engine, fit the head, evaluate it held out."""

    output_dir: str = field(
        default="runs/length-head",
        metadata={"help": "Folder for the record cache, the trained head (OUTPUT_DIR/length_head) and its summary."},
    )
    target: str = target_field("smollm2-135m")
    target_dtype: str = dtype_field("the target and drafter while recording")
    drafter: str = drafter_field(help_text=f"Drafter whose hidden states the head reads: {DRAFTER_HELP}")
    train_domains: list[str] = field(
        default_factory=lambda: ["code", "math", "chat"],
        metadata={"help": "Domains of the training and held-out prompts."},
    )
    train_prompts_per_domain: int = field(
        default=100, metadata={"help": "Training-split prompts per domain decoded for training records."}
    )
    eval_prompts_per_domain: int = field(
        default=40, metadata={"help": "Eval-split prompts per domain decoded for the held-out evaluation."}
    )
    max_new_tokens: int = field(default=96, metadata={"help": "Tokens generated per prompt while recording."})
    batch_size: int = field(default=8, metadata={"help": "Prompts decoded together while recording."})
    max_record_minutes: float | None = field(
        default=10.0,
        metadata={
            "help": "Stop recording training prompts after the shard that crosses this budget (a rerun resumes); "
            "held-out prompts are always recorded."
        },
    )
    records_dir: str | None = field(
        default=None, metadata={"help": "Record cache, shareable between runs (default: OUTPUT_DIR/records)."}
    )
    head_size: int = field(default=256, metadata={"help": "Width of the head's MLP (AdaFlash: 256)."})
    epochs: int = field(
        default=20,
        metadata={"help": "Passes over the training records (the epoch with the best validation loss is kept)."},
    )
    lr: float = field(
        default=2e-4,
        metadata={"help": "Peak AdamW learning rate, decayed to 0 over the run by a cosine (AdaFlash's recipe: 2e-4)."},
    )
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay."})
    train_batch_size: int = field(default=256, metadata={"help": "Records per optimizer step."})
    validation_fraction: float = field(
        default=0.1, metadata={"help": "Share of training records held back to pick the epoch."}
    )
    head_dtype: str = field(
        default="fp32",
        metadata={"help": "dtype of the saved head (it is tiny either way).", "choices": ("fp32", "bf16")},
    )
    seed: int = seed_field("prompt order, initialisation and batches")
    num_threads: int | None = num_threads_field()

    def __post_init__(self) -> None:
        for name in (
            "train_prompts_per_domain",
            "eval_prompts_per_domain",
            "max_new_tokens",
            "batch_size",
            "head_size",
            "epochs",
            "train_batch_size",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")
        if self.max_new_tokens < 2:
            raise ValueError(
                "max_new_tokens must be >= 2 (a round verifies drafts only while 2 or more tokens are left), got "
                f"{self.max_new_tokens}."
            )
        if self.lr <= 0 or self.weight_decay < 0:
            raise ValueError(
                f"lr must be > 0 and weight_decay >= 0, got lr={self.lr}, weight_decay={self.weight_decay}."
            )
        if not 0.0 < self.validation_fraction < 1.0:
            raise ValueError(f"validation_fraction must be in (0, 1), got {self.validation_fraction}.")
        check_choice("target_dtype", self.target_dtype, DTYPES)
        check_choice("head_dtype", self.head_dtype, ("fp32", "bf16"))
        if self.max_record_minutes is not None and self.max_record_minutes <= 0:
            raise ValueError(f"max_record_minutes must be > 0 or None, got {self.max_record_minutes}.")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be >= 1 or None, got {self.num_threads}.")
        if not self.train_domains:
            raise ValueError("train_domains is empty.")
