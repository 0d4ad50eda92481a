"""Offline training of an AdaFlash drafter for a frozen target: `TrainDrafterConfig` + `train_drafter`.

One step: target forward over a batch (context features + greedy labels) -> sample anchors ->
drafter forward over all blocks at once -> target lm_head on the supervised block positions ->
position-decayed cross-entropy -> AdamW. The loop runs under `accelerate.Accelerator`: alone it is a thin
wrapper, and under ``accelerate launch`` the processes (GPUs, CPU processes over gloo, machines) train
data-parallel on shares of each batch, equal to one process (:mod:`.distributed`). Compute runs under bf16
autocast where bf16 is the faster dtype (fp32 elsewhere).

Everything a run produces lives in ``output_dir``: ``data/`` (cached self-generated sequences, or
``data_dir`` to share them between runs),
``checkpoints/step_N/`` (drafter, optimizer, step, elapsed time, RNG; a rerun resumes from the
latest), ``metrics.jsonl``, ``curves.png`` and ``drafter/`` (final bf16 weights plus
``training_summary.json``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import random
import time
from dataclasses import asdict
from pathlib import Path

import torch
from accelerate import Accelerator
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..modeling_adaflash import AdaFlashDrafter
from .anchors import sample_anchors
from .checkpointing import load_latest_checkpoint, save_checkpoint, trim_metrics
from .configs import TrainDrafterConfig
from .data import (
    Batch,
    TargetFeatures,
    TrainingSequence,
    _read_shard,
    collate,
    generate_responses,
    pack_corpus,
    target_features,
)
from .distributed import Processes, process_rows, rows_of
from .init import build_drafter
from .losses import position_weights
from .monitoring import engine_check, plot_curves
from .step import acceptance_counts, autocast_in, compute_dtype, drafter_block_forward

logger = logging.getLogger(__name__)


def pick_mask_token_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The highest-id special token that is neither bos/eos/pad/unk nor used by the chat template.

    Such rows are trained embeddings that ordinary text never produces (SmolLM2: 16 ``<empty_output>``).
    """
    reserved = {tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id}
    template = tokenizer.chat_template or ""
    candidates = [
        i
        for i, tok in tokenizer.added_tokens_decoder.items()
        if tok.special and i not in reserved and tok.content not in template
    ]
    if not candidates:
        raise ValueError("The tokenizer has no unused special token: pass mask_token_id explicitly.")
    return max(candidates)


# --------------------------------------------------------------------------------------------
# Helpers of the loop
# --------------------------------------------------------------------------------------------


def lr_factor(step: int, elapsed_min: float, config: TrainDrafterConfig) -> float:
    """Linear warmup, then cosine from 1 to 0.1 over the nearer of the step and time budgets."""
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.max_steps - config.warmup_steps)
    if config.max_minutes is not None:
        progress = max(progress, elapsed_min / config.max_minutes)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


@torch.no_grad()
def evaluate(
    drafter: AdaFlashDrafter,
    target: PreTrainedModel,
    sequences: list[TrainingSequence],
    config: TrainDrafterConfig,
    pad_token_id: int,
    autocast,
) -> dict:
    """Teacher-forced held-out estimate: loss, tau = 1 + mean accepted drafts, acceptance by position."""
    drafter.eval()
    generator = torch.Generator().manual_seed(1234)  # the same anchors at every evaluation
    weights = position_weights(config.block_size, config.gamma)
    k = config.block_size - 1
    hits, seen = torch.zeros(k), torch.zeros(k)
    accepted, losses = [], []
    for lo in range(0, len(sequences), 4):
        batch = collate(sequences[lo : lo + 4], pad_token_id)
        features = target_features(target, batch, drafter.config.target_layer_ids)
        anchors, valid = sample_anchors(batch.label_mask, config.eval_anchors, generator)
        device = features.context.device
        with autocast():
            out = drafter_block_forward(
                drafter, target, batch, features, anchors.to(device), valid.to(device), weights, consistent_labels=True
            )
        acc, h, s = acceptance_counts(out.predictions.cpu(), out.labels.cpu())
        accepted.append(acc)
        hits += h
        seen += s
        losses.append(float(out.loss))
    drafter.train()
    accepted_all = torch.cat(accepted).float()
    return {
        "loss": sum(losses) / len(losses),
        "tau": 1.0 + float(accepted_all.mean()),
        "position_acceptance": (hits / seen.clamp_min(1)).tolist(),
    }


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------


def train_drafter(
    config: TrainDrafterConfig, target: PreTrainedModel | None = None, tokenizer: PreTrainedTokenizerBase | None = None
) -> Path:
    """Train a drafter for ``config.target`` and return the folder of the final bf16 drafter.

    ``target``/``tokenizer`` may be passed already loaded (tests use tiny random models); otherwise
    ``config.target`` is loaded with :func:`adaflash_hf.targets.load_target`.
    """
    from ..data import load_prompts, load_text_corpus

    wall_start = time.perf_counter()
    if config.num_threads is not None:
        torch.set_num_threads(config.num_threads)
    output_dir = Path(config.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    processes = Processes(accelerator)
    rows = process_rows(config.batch_size, processes.count, accelerator.process_index)  # this process's rows
    random.seed(config.seed)  # the same seeds in every process: they draw the same global batches and anchors
    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed)

    # 1. Frozen target.
    if target is None or tokenizer is None:
        from ..targets import load_target

        target, tokenizer = load_target(config.target, dtype=config.target_dtype)
    target = target.to(accelerator.device).eval().requires_grad_(False)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    # 2. Data: held-out self-generated responses, training responses and packed corpus text.
    data_start = time.perf_counter()
    gen_kwargs = dict(
        max_new_tokens=config.gen_max_new_tokens, batch_size=config.gen_batch_size, target_name=config.target
    )
    eval_prompts = load_prompts(config.train_domains, split="eval", limit_per_domain=config.eval_prompts_per_domain)
    data_dir = Path(config.data_dir) if config.data_dir is not None else output_dir / "data"
    with accelerator.main_process_first():  # the main process generates, the others read its cache
        eval_sequences = generate_responses(
            target, tokenizer, list(eval_prompts["prompt"]), data_dir / "eval", **gen_kwargs
        )
        self_gen: list[TrainingSequence] = []
        store = None
        if config.feature_cache is not None:  # responses and their target features, computed once
            from .features import FeatureStore

            store = FeatureStore(config.feature_cache, config.feature_cache_shards)
            pools = {kind: store.indices(kind) for kind in ("response", "corpus")}  # pool index -> store index
            self_gen = [store.training_sequence(i) for i in pools["response"]]
        elif config.corpus_fraction < 1.0 and config.self_gen_cached_only:
            # every prompt set cached under DATA_DIR/train, as cache-features reads them
            from .features import source_shards

            try:
                self_gen = [s for shard in source_shards(data_dir) for s in _read_shard(shard)]
            except FileNotFoundError as e:
                raise ValueError(f"{e} Or drop --self-gen-cached-only.") from None
        elif config.corpus_fraction < 1.0:
            train_prompts = load_prompts(
                config.train_domains,
                split="train",
                limit_per_domain=config.self_gen_prompts_per_domain,
                seed=config.seed,
            )
            self_gen = generate_responses(
                target,
                tokenizer,
                list(train_prompts["prompt"]),
                data_dir / "train",
                **gen_kwargs,
            )
    corpus: list[TrainingSequence] = []
    if config.corpus_fraction > 0.0 and store is not None and pools["corpus"]:
        # corpus windows cached beside the responses (cache-features --corpus): they replace live corpus text
        corpus = [store.training_sequence(i) for i in pools["corpus"]]
        logger.info("corpus windows from the feature cache: %d windows", len(corpus))
    elif config.corpus_fraction > 0.0:
        texts = load_text_corpus(
            config.train_domains, split="train", limit_per_domain=config.corpus_limit_per_domain, seed=config.seed
        )
        corpus = pack_corpus(tokenizer, list(texts["text"]), config.seq_len)
    data_minutes = (time.perf_counter() - data_start) / 60
    data_sizes = {
        "corpus_sequences": len(corpus),
        "corpus_tokens": sum(len(s) for s in corpus),
        "self_gen_sequences": len(self_gen),
        "self_gen_response_tokens": sum(len(s) - s.start for s in self_gen),
        "eval_sequences": len(eval_sequences),
        "eval_response_tokens": sum(len(s) - s.start for s in eval_sequences),
    }
    logger.info("data ready in %.1f min: %s", data_minutes, data_sizes)

    # 3. Drafter, optimizer, resume.
    mask_token_id = config.mask_token_id if config.mask_token_id is not None else pick_mask_token_id(tokenizer)
    drafter = build_drafter(config, target, mask_token_id, store, self_gen or eval_sequences, pad_id)
    optimizer = torch.optim.AdamW(
        drafter.parameters(), lr=config.lr, weight_decay=config.weight_decay, betas=(0.9, 0.95)
    )
    state = {"step": 0, "train_minutes": 0.0, "tokens_seen": 0}
    resumed = load_latest_checkpoint(output_dir) if config.resume else None
    if resumed is not None:
        latest, ckpt = resumed
        drafter.load_state_dict(ckpt["drafter"])
        optimizer.load_state_dict(ckpt["optimizer"])
        state = ckpt["state"]
        torch.set_rng_state(ckpt["rng"]["torch"])
        random.setstate(ckpt["rng"]["python"])
        generator.set_state(ckpt["rng"]["generator"])
        logger.info("resumed from %s (step %d)", latest, state["step"])
    earlier_wall = state.get("wall_minutes", 0.0)  # wall time of the processes before a resume

    def wall_minutes() -> float:
        return earlier_wall + (time.perf_counter() - wall_start) / 60

    drafter, optimizer = accelerator.prepare(drafter, optimizer)
    raw_drafter = accelerator.unwrap_model(drafter)
    raw_drafter.train()
    weights = position_weights(config.block_size, config.gamma, config.loss_positions)

    # One precision for every process: the CPU's bf16-or-fp32 choice is timed, so the main process's decides.
    bf16 = processes.main_value(float(compute_dtype(accelerator.device, target.dtype) == torch.bfloat16))
    dtype = torch.bfloat16 if bf16 else torch.float32

    def autocast():
        return autocast_in(accelerator.device, dtype)

    metrics_path = output_dir / "metrics.jsonl"
    if processes.is_main:
        trim_metrics(metrics_path, state["step"] if resumed is not None else -1)
    metrics = metrics_path.open("a") if processes.is_main else None

    def log(record: dict) -> None:
        if metrics is not None:
            metrics.write(json.dumps(record) + "\n")
            metrics.flush()

    def next_batch() -> tuple[Batch, TargetFeatures | None, torch.Tensor]:
        """This process's rows of a micro-batch, with their features when they come from the cache (None: run the
        target), and the label mask of the whole micro-batch (every process samples the anchors of every row)."""
        use_corpus = not self_gen or (corpus and torch.rand((), generator=generator).item() < config.corpus_fraction)
        pool = corpus if use_corpus else self_gen
        picks = torch.randint(len(pool), (config.batch_size,), generator=generator).tolist()
        cached = store is not None and (not use_corpus or bool(pools["corpus"]))
        if cached:
            pool_indices = pools["corpus" if use_corpus else "response"]
            batch, features = store.batch([pool_indices[i] for i in picks[rows]], pad_id)
            whole = batch if processes.count == 1 else collate([pool[i] for i in picks], pad_id)
            return batch, features, whole.label_mask
        whole = collate([pool[i] for i in picks], pad_id)
        return rows_of(whole, rows), None, whole.label_mask

    # 4. Train: target features -> anchors -> drafter blocks -> weighted CE -> AdamW.
    last_eval = None
    if state["step"] == 0 and processes.is_main and (config.init_from is not None or config.init_layers == "target"):
        last_eval = evaluate(raw_drafter, target, eval_sequences, config, pad_id, autocast)
        log({"kind": "eval", "step": 0, "minutes": 0.0, **last_eval})
        logger.info("init drafter: held-out tau %.3f", last_eval["tau"])
        state["held_out_at_init"] = last_eval  # kept in checkpoints: a resumed run's summary still has it
    loop_start = time.perf_counter() - state["train_minutes"] * 60
    bar = tqdm(
        total=config.max_steps, initial=state["step"], desc="train drafter", unit="step", disable=not processes.is_main
    )
    recent_loss, recent_acc = [], []
    reuse_left = 0  # micro-batches still to draw from the current target forward
    while state["step"] < config.max_steps:
        elapsed_min = processes.main_value((time.perf_counter() - loop_start) / 60)  # all stop at the same step
        if config.max_minutes is not None and elapsed_min >= config.max_minutes:
            logger.info("time budget of %.1f min reached at step %d", config.max_minutes, state["step"])
            break
        for group in optimizer.param_groups:
            group["lr"] = config.lr * lr_factor(state["step"], elapsed_min, config)
        accepted = []
        for micro in range(config.grad_accum):
            if reuse_left == 0:
                tick = time.perf_counter()
                batch, features, label_mask = next_batch()
                if features is None:
                    features = target_features(target, batch, raw_drafter.config.target_layer_ids)
                # cached context is bf16: kept so under bf16 autocast, cast once to fp32 where the step computes in fp32
                features.context = features.context.to(accelerator.device, dtype)
                features.labels = features.labels.to(accelerator.device)
                state["target_seconds"] = state.get("target_seconds", 0.0) + time.perf_counter() - tick
                reuse_left = config.steps_per_forward
            reuse_left -= 1
            anchors, valid = sample_anchors(label_mask, config.num_anchors, generator)
            anchors, valid = anchors[rows], valid[rows]
            synced = micro == config.grad_accum - 1  # DDP all-reduces the gradients at the last micro-batch only
            with autocast(), contextlib.nullcontext() if synced else accelerator.no_sync(drafter):
                device = features.context.device
                out = drafter_block_forward(
                    drafter,
                    target,
                    batch,
                    features,
                    anchors.to(device),
                    valid.to(device),
                    weights,
                    config.consistent_labels,
                    config.distill_weight,
                    processes.mean_fn(),
                    reach_weighted=config.position_weighting == "reach",
                )
                accelerator.backward(out.loss / config.grad_accum)
            accepted.append(acceptance_counts(out.predictions.cpu(), out.labels.cpu())[0])
            state["tokens_seen"] += int(label_mask.sum())  # the whole micro-batch's, on every process
        accelerator.clip_grad_norm_(drafter.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        state["step"] += 1
        state["train_minutes"] = (time.perf_counter() - loop_start) / 60

        recent_loss.append(float(processes.mean(out.loss.detach())))  # the whole micro-batch's loss
        recent_acc.append(1.0 + processes.mean_of_all(torch.cat(accepted)))
        recent_loss, recent_acc = recent_loss[-20:], recent_acc[-20:]
        train_loss, train_tau = sum(recent_loss) / len(recent_loss), sum(recent_acc) / len(recent_acc)
        bar.update(1)
        bar.set_postfix(
            loss=f"{train_loss:.3f}", tau=f"{train_tau:.2f}", held_out=f"{last_eval['tau']:.3f}" if last_eval else "-"
        )
        if state["step"] % 10 == 0:
            log(
                {
                    "kind": "train",
                    "step": state["step"],
                    "minutes": state["train_minutes"],
                    "loss": train_loss,
                    "train_tau": train_tau,
                    "lr": optimizer.param_groups[0]["lr"],
                    "tokens_seen": state["tokens_seen"],
                    "target_forward_fraction": state.get("target_seconds", 0.0)
                    / max(1e-9, state["train_minutes"] * 60),
                }
            )
        if state["step"] % config.eval_every == 0 and processes.is_main:
            last_eval = evaluate(raw_drafter, target, eval_sequences, config, pad_id, autocast)
            log({"kind": "eval", "step": state["step"], "minutes": state["train_minutes"], **last_eval})
            logger.info(
                "step %d: held-out tau %.3f, acceptance %s",
                state["step"],
                last_eval["tau"],
                [round(a, 3) for a in last_eval["position_acceptance"][:4]],
            )
            plot_curves(metrics_path, output_dir / "curves.png")
        if state["step"] % config.checkpoint_every == 0 and processes.is_main:
            state["wall_minutes"] = wall_minutes()
            save_checkpoint(output_dir, raw_drafter, optimizer, state, generator)
    bar.close()
    final_dir = output_dir / "drafter"
    if not processes.is_main:  # the main process evaluates and writes; the others end once the drafter is saved
        accelerator.wait_for_everyone()
        return final_dir
    state["wall_minutes"] = wall_minutes()
    save_checkpoint(output_dir, raw_drafter, optimizer, state, generator)

    # 5. Final held-out evaluation, a real-engine check, bf16 weights and the summary.
    final_eval = evaluate(raw_drafter, target, eval_sequences, config, pad_id, autocast)
    log({"kind": "eval", "step": state["step"], "minutes": state["train_minutes"], **final_eval})
    metrics.close()
    plot_curves(metrics_path, output_dir / "curves.png")
    raw_drafter.to(torch.bfloat16).save_pretrained(final_dir)
    accelerator.wait_for_everyone()
    engine = None
    if config.engine_eval_prompts:
        picks = list(eval_prompts["prompt"])[:: max(1, len(eval_prompts) // config.engine_eval_prompts)][
            : config.engine_eval_prompts
        ]
        engine = engine_check(raw_drafter.to(target.dtype), target, tokenizer, picks, config.gen_max_new_tokens)
        logger.info(
            "engine check: tau %.3f, acceptance %s, %.1f tok/s speculative vs %.1f plain",
            engine["tau"],
            [round(a, 3) for a in engine["position_acceptance"][:4]],
            engine["spec_tokens_per_s"],
            engine["plain_tokens_per_s"],
        )
    summary = {
        "recipe": asdict(config),
        "mask_token_id": mask_token_id,
        "target_layer_ids": raw_drafter.config.target_layer_ids,
        "data_sizes": data_sizes,
        "data_minutes": data_minutes,
        "train_minutes": state["train_minutes"],
        "steps": state["step"],
        "supervised_tokens_seen": state["tokens_seen"],
        "feature_cache": None
        if store is None
        else {"dir": str(store.cache_dir), "tokens": store.num_tokens, "corpus_tokens": store.tokens_of("corpus")},
        "wall_minutes": wall_minutes(),  # summed over resumed processes
        "held_out_teacher_forced": final_eval,
        "held_out_at_init": state.get("held_out_at_init"),
        "engine_check": engine,
    }
    (final_dir / "training_summary.json").write_text(json.dumps(summary, indent=2))
    return final_dir
