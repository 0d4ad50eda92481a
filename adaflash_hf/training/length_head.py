"""Training the adaptive length head on the engine's own acceptance records: ``adaflash train-length-head``.

Records (:mod:`~adaflash_hf.training.length_head_records`): the real engine decodes training prompts and
records, every round and row, what the head reads and what was accepted. Fitting and evaluation
(:mod:`~adaflash_hf.training.length_head_fit`): a discrete survival loss, scored on held-out prompts
against the engine's own estimator. This module is the command that runs both, and loads a head.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..configuration_length_head import AdaFlashLengthHeadConfig
from ..model_card import length_head_card
from ..modeling_length_head import AdaFlashLengthHead
from .configs import TrainLengthHeadConfig
from .length_head_fit import calibration, fit_head, predict_logits, table_rates, time_head
from .length_head_records import SHARD_PROMPTS, AlwaysDraftState, collect_records, drafter_fingerprint

logger = logging.getLogger(__name__)

HEAD_FOLDER_SUFFIX = "-length-head"  # bundled/<preset>-length-head/ sits beside bundled/<preset>/


# ---------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------


def train_length_head(
    config: TrainLengthHeadConfig,
    target: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    drafter: PreTrainedModel | None = None,
) -> dict:
    """Record, fit and evaluate a length head for ``config.drafter``; save it to ``output_dir/length_head``.

    ``target``/``tokenizer``/``drafter`` may be passed already loaded (tests use tiny random models).
    Returns the summary also written to ``length_head/training_summary.json``.
    """
    from ..data import load_prompts

    wall_start = time.perf_counter()
    if config.num_threads is not None:
        torch.set_num_threads(config.num_threads)
    torch.manual_seed(config.seed)
    output_dir = Path(config.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)

    # 1. Target and drafter.
    if target is None or tokenizer is None:
        from ..targets import load_target

        target, tokenizer = load_target(config.target, dtype=config.target_dtype)
    if drafter is None:
        from ..drafters import load_drafter

        drafter = load_drafter(config.drafter, target, target_name=config.target, datastore=False)
    drafter = drafter.eval()

    # 2. Records: training prompts first, then held-out prompts with the estimator the training prompts warmed up.
    record_start = time.perf_counter()
    state = AlwaysDraftState()
    key = json.dumps([config.target, str(target.dtype), drafter_fingerprint(drafter), config.max_new_tokens])
    records_dir = Path(config.records_dir) if config.records_dir is not None else output_dir / "records"
    common = dict(key=key, max_new_tokens=config.max_new_tokens, batch_size=config.batch_size)
    train_prompts = load_prompts(
        config.train_domains, split="train", limit_per_domain=config.train_prompts_per_domain, seed=config.seed
    )
    eval_prompts = load_prompts(config.train_domains, split="eval", limit_per_domain=config.eval_prompts_per_domain)
    train = collect_records(
        target,
        drafter,
        tokenizer,
        list(train_prompts["prompt"]),
        records_dir / "train",
        state,
        max_minutes=config.max_record_minutes,
        desc="record (train prompts)",
        **common,
    )
    held_out = collect_records(
        target,
        drafter,
        tokenizer,
        list(eval_prompts["prompt"]),
        records_dir / "eval",
        state,
        desc="record (held-out prompts)",
        **common,
    )
    if train is None or held_out is None:
        raise ValueError(
            "no acceptance records: the prompts produced no verified drafter blocks (all too long, or "
            "max_new_tokens too small). Use more prompts or a larger --max-new-tokens."
        )
    record_minutes = (time.perf_counter() - record_start) / 60

    # 3. Fit, picking the epoch on held-back training records (the held-out prompts stay unseen).
    if len(train) < 2:
        raise ValueError(f"{len(train)} training record(s): too few to fit and validate a head. Use more prompts.")
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(config.seed))
    num_val = min(len(train) - 1, max(1, round(len(train) * config.validation_fraction)))
    fit, validation = train.select(order[num_val:]), train.select(order[:num_val])
    head = AdaFlashLengthHead(
        AdaFlashLengthHeadConfig(
            hidden_size=drafter.config.hidden_size,
            block_size=drafter.config.block_size,
            head_size=config.head_size,
            drafter=config.drafter if config.drafter != "auto" else f"bundled:{config.target}",
        )
    )
    fit_start = time.perf_counter()
    history = fit_head(
        head, fit, validation, config.epochs, config.lr, config.weight_decay, config.train_batch_size, config.seed
    )
    fit_minutes = (time.perf_counter() - fit_start) / 60

    # 4. Held-out calibration: the head against the engine's estimator and its refit feature table.
    head.eval()
    truth = (held_out.accept_lengths, held_out.num_verified)
    evaluation = {
        "length_head": calibration(torch.sigmoid(predict_logits(head, held_out)), *truth),
        "engine_estimator": calibration(held_out.rates, *truth),
        "estimator_features_refit": calibration(table_rates(train, held_out), *truth),
        "position_only": calibration(table_rates(train, held_out, use_top_prob=False), *truth),
    }
    for name, result in evaluation.items():
        logger.info(
            "held-out %-24s log-loss %.4f  Brier %.4f  length MAE %.3f  bias %+.3f",
            name,
            result["log_loss"],
            result["brier"],
            result["length_mae"],
            result["length_bias"],
        )
    if evaluation["length_head"]["log_loss"] >= evaluation["engine_estimator"]["log_loss"]:
        logger.warning(
            "the length head does not beat the engine's estimator on held-out log-loss (%.4f vs %.4f)",
            evaluation["length_head"]["log_loss"],
            evaluation["engine_estimator"]["log_loss"],
        )

    # 5. Save the head, its summary and model card.
    head_dir = output_dir / "length_head"
    head.to(torch.bfloat16 if config.head_dtype == "bf16" else torch.float32).save_pretrained(head_dir)
    summary = {
        "recipe": asdict(config),
        "records": {
            "train": len(fit),
            "validation": len(validation),
            "held_out": len(held_out),
            "train_prompts": min(len(train_prompts), (int(train.shards.max()) + 1) * SHARD_PROMPTS),
            "held_out_prompts": len(eval_prompts),
        },
        "record_minutes": record_minutes,
        "fit_minutes": fit_minutes,
        "wall_minutes": (time.perf_counter() - wall_start) / 60,
        "history": history,
        "held_out": evaluation,
        "head_seconds_batch1": time_head(head.float(), 1),
        "drafter_seconds_ema": state.drafter_cost(
            config.batch_size
        ),  # the engine's measured drafter pass at --batch-size rows
        "head_parameters": sum(p.numel() for p in head.parameters()),
    }
    (head_dir / "training_summary.json").write_text(json.dumps(summary, indent=2))
    length_head_card(head.config.to_dict(), summary).save(head_dir / "README.md")
    return summary


def load_length_head(
    name_or_path: str, drafter: PreTrainedModel | None = None, target_name: str | None = None
) -> AdaFlashLengthHead:
    """Resolve ``name_or_path`` to a length head (on the drafter's device, when given), checked against ``drafter``.

    ``"auto"``: the head bundled beside the drafter of preset ``target_name`` (default: the preset whose bundled
    drafter ``drafter`` was loaded from); anything else: a local folder or Hub id.
    """
    from ..drafters import BUNDLED_DIR

    if name_or_path == "auto":
        if target_name is None and drafter is not None:
            drafter_dir = Path(drafter.name_or_path).resolve()
            target_name = drafter_dir.name if drafter_dir.parent == BUNDLED_DIR.resolve() else None
        path = BUNDLED_DIR / f"{target_name}{HEAD_FOLDER_SUFFIX}" if target_name else None
        if path is None or not (path / "config.json").is_file():
            shipped = sorted(
                p.name.removesuffix(HEAD_FOLDER_SUFFIX) for p in BUNDLED_DIR.glob(f"*{HEAD_FOLDER_SUFFIX}")
            )
            raise ValueError(
                f"No length head is bundled for {target_name or 'this drafter'!r} "
                f"(bundled for: {', '.join(shipped) or 'none'}). "
                "Pass a folder or Hub id, or train one with `adaflash train-length-head --target <preset> --drafter "
                "<drafter>`."
            )
        name_or_path = str(path)
    from safetensors import SafetensorError

    from ..drafters import checkpoint_source

    name_or_path = checkpoint_source(
        name_or_path,
        "length head",
        "a length head is 'auto' (bundled beside a preset's "
        "drafter), a local folder with config.json, or a Hub id (owner/name)",
    )
    try:
        head, info = AdaFlashLengthHead.from_pretrained(name_or_path, output_loading_info=True)
    except SafetensorError as error:
        raise OSError(
            f"The length head weights in {name_or_path} cannot be read ({error}): the file is corrupt or was "
            "only partly downloaded. Download or save the checkpoint again."
        ) from error
    broken = {k: sorted(v)[:8] for k, v in info.items() if k in ("missing_keys", "mismatched_keys") and v}
    if broken:
        raise ValueError(
            f"The length head in {name_or_path} is incomplete or does not match its config: {broken}. "
            "Re-download it, or check that config.json belongs to these weights."
        )
    if drafter is not None:
        head.check_drafter(drafter)
        head.to(drafter.device)
    return head.eval()
