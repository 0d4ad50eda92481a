"""The configs of the data commands, light on purpose (no torch or transformers at import).

``adaflash generate-data``, ``cache-features`` and ``prepare-drafter`` build their options from these
dataclasses, so ``adaflash <command> --help`` loads this module only; the modules that run the commands
(:mod:`.data`, :mod:`.features`, :mod:`.vocab`) import torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..cli_args import (
    DTYPES,
    check_choice,
    drafter_field,
    dtype_field,
    num_threads_field,
    seed_field,
    target_field,
)


@dataclass
class GenerateDataConfig:
    """``adaflash generate-data``: the target's own greedy responses to training prompts, cached for training."""

    data_dir: str = field(
        metadata={"help": "Data folder shared with train-drafter (--data-dir); responses go to DATA_DIR/train."}
    )
    target: str = target_field("smollm2-135m")
    target_dtype: str = dtype_field()
    drafter: str = drafter_field(
        "none",
        "'none': transformers' batched generate (fastest on CPU at batch >= 4, measured); 'auto' or a folder: "
        "adaflash-hf's batched engine with that drafter. Both give the target's greedy tokens",
    )
    train_domains: list[str] = field(
        default_factory=lambda: ["code", "math", "chat"], metadata={"help": "Domains of the training prompts."}
    )
    prompts: str | None = field(
        default=None,
        metadata={
            "help": 'A JSONL file of your own prompts ({"prompt": ..., "domain": ...} per line, e.g. logged traffic) '
            "to answer instead of the training prompts of --train-domains; their responses join the datastore that "
            "prepare-drafter builds from DATA_DIR/train."
        },
    )
    prompts_per_domain: int = field(
        default=10_000,
        metadata={
            "help": "Training prompts per domain (train-drafter's --self-gen-prompts-per-domain; the same value "
            "finds the same cache); with --prompts, at most this many of the file's prompts per domain."
        },
    )
    seed: int = seed_field("the prompt order (train-drafter's --seed)")
    max_new_tokens: int = field(
        default=256, metadata={"help": "Response length (train-drafter's --gen-max-new-tokens)."}
    )
    batch_size: int = field(default=16, metadata={"help": "Prompts decoded together."})
    max_minutes: float | None = field(
        default=None, metadata={"help": "Stop after the shard that crosses this budget; a rerun resumes."}
    )
    temperature: float = field(
        default=0.0,
        metadata={
            "help": "0: the target's greedy answers; > 0: sampled answers at this temperature, for more data once "
            "the prompts run out (training labels stay the target's argmax at every position)."
        },
    )
    samples_per_prompt: int = field(
        default=1,
        metadata={"help": "With --temperature > 0: sampled answers per prompt, each set cached in its own folder."},
    )
    num_threads: int | None = num_threads_field()

    def __post_init__(self) -> None:
        if not self.temperature >= 0:  # also catches nan
            raise ValueError(f"temperature {self.temperature}: must be >= 0 (0 is greedy, > 0 samples).")
        if self.samples_per_prompt > 1 and self.temperature == 0:
            raise ValueError(
                f"samples_per_prompt {self.samples_per_prompt} needs --temperature > 0: greedy answers are all "
                "the same."
            )
        for name in ("prompts_per_domain", "max_new_tokens", "batch_size", "samples_per_prompt"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")
        if self.max_minutes is not None and self.max_minutes <= 0:
            raise ValueError(f"max_minutes must be > 0 or None, got {self.max_minutes}.")
        check_choice("target_dtype", self.target_dtype, DTYPES)
        if not self.train_domains:
            raise ValueError("train_domains is empty: give at least one domain.")


@dataclass
class PrepareDrafterConfig:
    """``adaflash prepare-drafter``: attach a draft vocabulary and a datastore, both from the target's own outputs,
    to a drafter."""

    drafter: str = field(
        metadata={"help": "Drafter folder (or 'auto' with --target, the bundled one) to attach the vocabulary to."}
    )
    output_dir: str = field(metadata={"help": "Where to write the drafter with its draft vocabulary."})
    data_dir: str | None = field(
        default=None,
        metadata={
            "help": "Cached self-generated data (adaflash generate-data --data-dir): counts and the datastore come "
            "from the greedy answers under DATA_DIR/train (sampled sets are left out), coverage from DATA_DIR/eval "
            "when present."
        },
    )
    target: str = target_field("smollm2-135m", "for 'auto' and the special tokens")
    size: int | None = field(
        default=None,
        metadata={
            "help": "Draft vocabulary size (default: the smallest tried size reaching --min-coverage on held-out "
            "responses)."
        },
    )
    min_coverage: float = field(default=0.99, metadata={"help": "Held-out coverage the automatic size must reach."})
    datastore: bool = field(
        default=True,
        metadata={
            "help": "Also write datastore.safetensors: every cached response, for the engine's datastore source."
        },
    )
    corpus_tokens: int = field(
        default=0,
        metadata={
            "help": "Also count the target's greedy predictions on this many tokens of training corpus text (one "
            "forward per 512-token window: far cheaper than generating; every tenth window held out)."
        },
    )
    keep_vocab: bool = field(
        default=False,
        metadata={
            "help": "Keep the drafter's own draft vocabulary (only add the datastore and, with --acceptance-prompts, "
            "the acceptance prior); its coverage is still reported."
        },
    )
    acceptance_prompts: int = field(
        default=0,
        metadata={
            "help": "Also write acceptance_prior.json: run the engine (greedy) on this many of the last cached "
            "training prompts, with a datastore that leaves their responses out, and keep the acceptance rates it "
            "learned, so a fresh process starts calibrated (needs --data-dir; about 3 s per prompt for SmolLM2 on 2 "
            "CPU cores)."
        },
    )
    acceptance_tokens: int = field(default=96, metadata={"help": "New tokens per --acceptance-prompts prompt."})

    def __post_init__(self) -> None:
        if self.acceptance_prompts < 0 or self.acceptance_tokens < 1:
            raise ValueError(
                f"acceptance_prompts must be >= 0 and acceptance_tokens >= 1, got {self.acceptance_prompts} "
                f"and {self.acceptance_tokens}."
            )
        if self.acceptance_prompts and self.data_dir is None:
            raise ValueError("acceptance_prompts needs data_dir: the prompts come from the cached training responses.")
        if self.keep_vocab and self.size is not None:
            raise ValueError(
                "keep_vocab keeps the drafter's draft vocabulary: drop size, or drop keep_vocab to choose a new one."
            )
        if self.size is not None and self.size < 1:
            raise ValueError(f"size must be >= 1 or unset, got {self.size}.")
        if self.corpus_tokens < 0:
            raise ValueError(f"corpus_tokens must be >= 0, got {self.corpus_tokens}.")
        if not 0 < self.min_coverage <= 1:
            raise ValueError(f"min_coverage must be in (0, 1], got {self.min_coverage}.")
        if self.data_dir is not None and not Path(self.data_dir).is_dir():
            raise FileNotFoundError(
                f"data_dir {self.data_dir}: no such folder; create it with `adaflash generate-data "
                f"--data-dir {self.data_dir}`."
            )
        if self.data_dir is None and not self.corpus_tokens:
            raise ValueError(
                "nothing to count: give data_dir (cached responses from adaflash generate-data) or corpus_tokens > 0."
            )


@dataclass
class CacheFeaturesConfig:
    """``adaflash cache-features``: run the target once over the cached responses and keep the drafter's context
    on disk."""

    data_dir: str | None = field(
        default=None,
        metadata={
            "help": "Data folder of adaflash generate-data: every response under DATA_DIR/train is cached (None: "
            "corpus windows only)."
        },
    )
    target: str = field(
        default="smollm2-135m", metadata={"help": "Target: preset name, local folder, .gguf or Hub id."}
    )
    corpus: list[str] | None = field(
        default=None,
        metadata={
            "help": "Also cache the training split's corpus text of these domains (e.g. code math chat), packed into "
            "--seq-len windows as train-drafter packs it: one target forward per token, labels the target's argmax."
        },
    )
    seq_len: int = field(default=512, metadata={"help": "With --corpus: tokens per corpus window."})
    seed: int = seed_field("the corpus chunks' order, with --corpus (train-drafter's --seed)")
    target_dtype: str = dtype_field("the target")
    target_layer_ids: list[int] | None = field(
        default=None,
        metadata={"help": "Target layers to keep (default: the five train-drafter reads when none are given)."},
    )
    cache_dir: str | None = field(
        default=None,
        metadata={
            "help": "Where the features go (default: <adaflash cache>/features/<target>-L<layer ids>, outside the "
            "repository)."
        },
    )
    batch_size: int = field(default=8, metadata={"help": "Sequences per target forward."})
    max_minutes: float | None = field(
        default=None, metadata={"help": "Stop after the shard that crosses this budget; a rerun resumes."}
    )
    num_threads: int | None = field(default=None, metadata={"help": "torch CPU threads (None: torch's default)."})

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}.")
        if self.max_minutes is not None and self.max_minutes <= 0:
            raise ValueError(f"max_minutes must be > 0 or None, got {self.max_minutes}.")
        if self.data_dir is None and not self.corpus:
            raise ValueError(
                "nothing to cache: pass --data-dir (responses of adaflash generate-data), --corpus DOMAIN ..., or both."
            )
        if self.data_dir is not None and not Path(self.data_dir).is_dir():
            raise FileNotFoundError(
                f"data_dir {self.data_dir}: no such folder; create it with `adaflash generate-data "
                f"--data-dir {self.data_dir}`."
            )
        if self.corpus:
            from ..data.prompts import DOMAINS

            unknown = [d for d in self.corpus if d not in DOMAINS]
            if unknown:
                raise ValueError(f"--corpus {' '.join(unknown)}: unknown domain; choose from {', '.join(DOMAINS)}.")
        if self.seq_len < 16:
            raise ValueError(f"seq_len must be >= 16, got {self.seq_len}.")
        check_choice("target_dtype", self.target_dtype, DTYPES)
