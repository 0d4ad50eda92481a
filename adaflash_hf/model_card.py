"""Model cards for drafter folders: Hub metadata plus the measured results and the command behind them.

A card is rendered from the training summary the trainer writes (``training_summary.json``) and,
optionally, an ``adaflash bench`` JSON; it never contains a number that is not in those files.
"""

from __future__ import annotations

import json
from pathlib import Path

from .cli_args import command_line
from .targets import PRESETS
from .training.trainer import TrainDrafterConfig


def render_model_card(config: dict, summary: dict, bench: dict | None = None, repo_id: str | None = None,
                      notes: list[str] | None = None, draft_data: dict | None = None) -> str:
    recipe = summary.get("recipe", {})
    target = recipe.get("target", "unknown")
    base_model = PRESETS[target].hub_id if target in PRESETS else target
    held_out = summary.get("held_out_teacher_forced") or {}
    engine = summary.get("engine_check") or {}
    lines = [
        "---",
        "library_name: adaflash-hf",
        f"base_model: {base_model}",
        "license: apache-2.0",
        "tags: [speculative-decoding, dflash, adaflash, block-diffusion, drafter]",
        "---",
        "",
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
        *_draft_data_lines(config, draft_data),
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
        lines.append("Held-out eval split (never trained on), teacher-forced on the target's own greedy outputs:")
        lines.append(f"tau {held_out.get('tau', float('nan')):.3f}, per-position acceptance "
                     f"{[round(a, 3) for a in held_out.get('position_acceptance', [])[:8]]}.")
    if engine:
        lines.append("")
        lines.append(f"Real engine on held-out prompts: tau {engine.get('tau', float('nan')):.3f}, "
                     f"{engine.get('spec_tokens_per_s', float('nan')):.1f} tok/s speculative vs "
                     f"{engine.get('plain_tokens_per_s', float('nan')):.1f} tok/s plain (same process).")
    if bench:
        lines += ["", f"`adaflash bench` ({bench.get('dtype', '?')}, {bench.get('torch_threads', '?')} CPU threads, batch 1, greedy):", "",
                  "| domain | method | tok/s | tau | accept rate | speed-up | same as target |", "|---|---|---|---|---|---|---|"]
        for r in bench["results"]:
            accept = "-" if r["accept_rate"] is None else f"{r['accept_rate']:.2f}"
            lines.append(f"| {r['domain']} | {r['method']} | {r['tokens_per_second']:.2f} | {r['mean_accepted_length']:.2f} | "
                         f"{accept} | {r['speedup']:.2f}x | {r['same_as_target']:.2f} |")
        if bench.get("command"):
            lines += ["", f"Command: `{bench['command']}`"]
    if notes:
        lines += ["", "## Notes", ""] + [f"- {note}" for note in notes]
    lines += ["", "## Limitations", "",
              "Trained on a 2-core CPU in well under three hours, on far less data than published GPU-trained "
              "DFlash drafters, so acceptance is much lower. The news, wiki and fiction domains were held out of "
              "training and accept less.", ""]
    return "\n".join(lines)


def _draft_data_lines(config: dict, draft_data: dict | None) -> list[str]:
    lines = []
    if config.get("draft_vocab_size"):
        coverage = f", covering {draft_data['heldout_coverage']:.2%} of held-out target output tokens" if draft_data else ""
        lines.append(f"- reduced draft vocabulary: the {config['draft_vocab_size']} most frequent target output tokens{coverage} "
                     "(logits only over these; verification stays over the full vocabulary, so decoding stays lossless)")
    if draft_data and draft_data.get("datastore_tokens"):
        lines.append(f"- `datastore.safetensors`: {draft_data['datastore_tokens']} tokens of the target's own greedy responses to "
                     "training prompts, used by the engine's `datastore` draft source (suffix matches)")
    return lines


def _wall_time_line(summary: dict) -> str:
    wall, data, train = (summary.get(k, 0.0) for k in ("wall_minutes", "data_minutes", "train_minutes"))
    if wall < train:  # summaries written before the trainer summed wall time over resumed processes
        return (f"- wall time: {train:.1f} min of training loop over resumed runs on a 2-core CPU (the last process ran "
                f"{wall:.1f} min, {data:.1f} of them loading data)")
    return f"- wall time: {wall:.1f} min in all ({data:.1f} data, {train:.1f} training) on a 2-core CPU"


def write_model_card(folder: str | Path, bench_json: str | Path | None = None, repo_id: str | None = None,
                     notes: list[str] | None = None) -> Path:
    """Write ``README.md`` into a drafter folder from its config and ``training_summary.json`` (and a bench JSON)."""
    folder = Path(folder)
    summary_path = folder / "training_summary.json"
    if not summary_path.is_file():
        raise FileNotFoundError(f"{summary_path} is missing: model cards are rendered from the trainer's summary.")
    config = json.loads((folder / "config.json").read_text())
    summary = json.loads(summary_path.read_text())
    bench = json.loads(Path(bench_json).read_text()) if bench_json else None
    draft_data = json.loads((folder / "draft_vocab.json").read_text()) if (folder / "draft_vocab.json").is_file() else None
    card = folder / "README.md"
    card.write_text(render_model_card(config, summary, bench, repo_id, notes, draft_data))
    return card
