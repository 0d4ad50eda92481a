"""Model cards: valid Hub metadata, model-index numbers taken from the files they come from, no drift."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from huggingface_hub import ModelCard
from huggingface_hub.repocard_data import model_index_to_eval_results

from adaflash_hf.drafters import BUNDLED_DIR
from adaflash_hf.model_card import _wall_time_line, adapter_card
from adaflash_hf.model_card_files import BUNDLED_CARDS, bundled_card, write_model_card
from adaflash_hf.targets import PRESETS
from adaflash_hf.training.trainer import TrainDrafterConfig

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = {entry.name: entry for entry in BUNDLED_CARDS}
ADAPTER_METRICS = {"tau": 2.31, "accept_rate": 0.27, "speedup": 1.82, "steps": 400, "loss": 0.71}


def _cards() -> dict[str, ModelCard]:
    cards = {name: bundled_card(entry, ROOT) for name, entry in BUNDLED.items()}
    cards["adapter"] = adapter_card("someone/smollm2-135m-adaflash", "smollm2-135m", 3, ADAPTER_METRICS)
    return cards


def _metrics(card: ModelCard) -> dict[tuple[str, str], float]:
    """{(dataset name, metric type): value} of a card's model-index."""
    return {(r.dataset_name, r.metric_type): r.metric_value for r in card.data.eval_results}


@pytest.mark.parametrize("name", [*BUNDLED, "adapter"])
def test_every_card_parses_as_hub_metadata_and_its_model_index_round_trips(name):
    card = ModelCard(str(_cards()[name]))  # parsed back from text, as the Hub reads README.md
    data = card.data.to_dict()
    assert {"base_model", "library_name", "pipeline_tag", "license", "tags", "model-index"} <= set(data), sorted(data)
    assert data["pipeline_tag"] == "text-generation" and data["license"] == "apache-2.0"
    assert data["library_name"] == ("peft" if name == "adapter" else "transformers")
    assert {"speculative-decoding", "adaflash", "dflash"} <= set(data["tags"])
    model_name, results = model_index_to_eval_results(data["model-index"])
    assert model_name == card.data.model_name and results == card.data.eval_results and results
    assert all(r.task_type == "text-generation" and r.dataset_split == "eval" for r in results)


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_readme_and_model_cards_file_are_what_the_generator_writes(name):
    expected = str(bundled_card(BUNDLED[name], ROOT))
    for path in (BUNDLED_DIR / BUNDLED[name].folder / "README.md", ROOT / "model_cards" / f"{name}.md"):
        assert path.read_text() == expected, f"{path} is stale: run `python -m adaflash_hf.model_card_files`"
        assert ModelCard.load(path).data.to_dict() == ModelCard(expected).data.to_dict()


def test_every_model_cards_file_has_a_generator_entry():
    assert {p.stem for p in (ROOT / "model_cards").glob("*.md")} == set(BUNDLED)


@pytest.mark.parametrize("name", [n for n, e in BUNDLED.items() if e.bench_json])
def test_drafter_model_index_holds_the_numbers_of_its_summary_and_bench(name):
    entry = BUNDLED[name]
    card = bundled_card(entry, ROOT)
    summary = json.loads((BUNDLED_DIR / entry.folder / "training_summary.json").read_text())
    bench = json.loads((ROOT / entry.bench_json).read_text())
    (row,) = [r for r in bench["results"] if r["method"] == "adaflash" and r["domain"] == "all"]
    assert (
        card.data.base_model == PRESETS[summary["recipe"]["target"]].hub_id == PRESETS[bench["args"]["target"]].hub_id
    )
    teacher_forced = [k for k in _metrics(card) if "teacher-forced" in k[0]]
    benched = [k for k in _metrics(card) if "bench" in k[0]]
    assert len(teacher_forced) + len(benched) == len(card.data.eval_results)  # nothing else is reported
    assert {k[1]: _metrics(card)[k] for k in teacher_forced} == {
        "mean_accepted_length": round(summary["held_out_teacher_forced"]["tau"], 4)
    }
    assert {k[1]: _metrics(card)[k] for k in benched} == {
        "mean_accepted_length": row["mean_accepted_length"],
        "accept_rate": row["accept_rate"],
        "speedup": row["speedup"],
    }


def test_length_head_model_index_holds_the_numbers_of_its_summary():
    entry = BUNDLED["smollm2-135m-length-head"]
    summary = json.loads((BUNDLED_DIR / entry.folder / "training_summary.json").read_text())
    head = summary["held_out"]["length_head"]
    card = bundled_card(entry, ROOT)
    assert card.data.base_model == PRESETS[summary["recipe"]["target"]].hub_id
    assert {k[1]: v for k, v in _metrics(card).items()} == {
        "log_loss": round(head["log_loss"], 4),
        "brier_score": round(head["brier"], 4),
        "mae": round(head["length_mae"], 4),
    }


def test_adapter_card_is_a_peft_card_on_the_drafter_with_only_measured_results():
    card = adapter_card("someone/smollm2-135m-adaflash", "smollm2-135m", 3, ADAPTER_METRICS)
    assert card.data.base_model == "someone/smollm2-135m-adaflash" and card.data.library_name == "peft"
    assert {k[1]: v for k, v in _metrics(card).items()} == {
        "mean_accepted_length": 2.31,
        "accept_rate": 0.27,
        "speedup": 1.82,
    }
    assert "v3" in card.data.model_name and "HuggingFaceTB/SmolLM2-135M-Instruct" in card.text
    assert "- steps: 400" in card.text and "- loss: 0.71" in card.text  # training metrics: in the text only

    partial = adapter_card("someone/d", "smollm2-135m", 1, {"tau": 1.5, "speedup": None})
    assert [r.metric_type for r in partial.data.eval_results] == ["mean_accepted_length"]
    bare = ModelCard(str(adapter_card("someone/d", "smollm2-135m", 1, {})))
    assert "model-index" not in bare.data.to_dict() and "None recorded" in bare.text


def _drafter_folder(tmp_path: Path, summary: dict, **config) -> Path:
    folder = tmp_path / "drafter"
    folder.mkdir(exist_ok=True)
    base = json.loads((BUNDLED_DIR / "smollm2-135m" / "config.json").read_text())
    base.pop("draft_vocab_size")
    (folder / "config.json").write_text(json.dumps({**base, **config}))
    (folder / "training_summary.json").write_text(json.dumps(summary))
    return folder


def test_drafter_card_carries_metadata_results_and_command(tmp_path):
    from dataclasses import asdict

    recipe = asdict(TrainDrafterConfig(output_dir="runs/x", block_size=8, num_anchors=128))
    summary = {
        "recipe": recipe,
        "data_sizes": {"corpus_tokens": 1000},
        "steps": 10,
        "supervised_tokens_seen": 5,
        "wall_minutes": 3.0,
        "data_minutes": 1.0,
        "train_minutes": 2.0,
        "held_out_teacher_forced": {"tau": 1.8, "position_acceptance": [0.5, 0.3]},
        "engine_check": {"tau": 1.7, "spec_tokens_per_s": 30.0, "plain_tokens_per_s": 20.0},
    }
    folder = _drafter_folder(tmp_path, summary)
    card = ModelCard.load(write_model_card(folder))
    assert card.data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct" and card.data.library_name == "transformers"
    assert [(r.metric_type, r.metric_value) for r in card.data.eval_results] == [("mean_accepted_length", 1.8)]
    assert "tau 1.800" in card.text and "30.0 tok/s speculative vs 20.0" in card.text
    assert "adaflash train-drafter --output-dir runs/x" in card.text and "--num-anchors 128" in card.text
    assert "reduced draft vocabulary" not in card.text and "greedy responses to training prompts" not in card.text

    (folder / "draft_vocab.json").write_text(json.dumps({"heldout_coverage": 0.975, "datastore_tokens": 1234}))
    summary["recipe"]["init_from"] = "auto"
    summary["held_out_at_init"] = {"tau": 1.5}
    del summary["held_out_teacher_forced"]
    card = ModelCard.load(write_model_card(_drafter_folder(tmp_path, summary, draft_vocab_size=16)))
    assert "the 16 most frequent target output tokens, covering 97.50%" in card.text
    assert "1234 tokens of the target's own greedy responses" in card.text
    assert "continued from `auto` (held-out tau 1.500 at step 0" in card.text
    assert "model-index" not in card.data.to_dict()  # no measured tau, no result


def test_card_of_a_run_whose_caches_are_gone_still_renders_a_command_the_shell_expands(tmp_path):
    """A card is rendered where the run's feature cache and starting drafter no longer exist (a clean clone, CI):
    the recorded recipe becomes the command line as it was, ``~/`` paths unquoted, retired fields left out."""
    import shlex
    from dataclasses import asdict

    recipe = asdict(TrainDrafterConfig(output_dir="runs/x"))
    recipe.update(feature_cache="~/gone/feature cache", init_from="~/runs/a/drafter", lr=1e-3, retired_field=3)
    summary = {"recipe": recipe, "steps": 10, "held_out_teacher_forced": {"tau": 1.8, "position_acceptance": [0.5]}}
    card = ModelCard.load(write_model_card(_drafter_folder(tmp_path, summary)))
    line = next(line for line in card.text.splitlines() if line.startswith("adaflash train-drafter"))
    assert "--feature-cache ~/'gone/feature cache'" in line and "--init-from ~/runs/a/drafter" in line
    words = shlex.split(line)
    assert words[words.index("--feature-cache") + 1] == "~/gone/feature cache"  # one word, tilde outside quotes
    assert words[words.index("--lr") + 1] == "0.001" and "retired" not in line


def test_card_without_a_training_summary_says_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="training_summary.json is missing"):
        write_model_card(tmp_path)


def test_wall_time_says_when_a_run_was_resumed():
    assert "resumed" in _wall_time_line({"wall_minutes": 20.0, "data_minutes": 0.1, "train_minutes": 60.0})
    assert "63.0 min in all" in _wall_time_line({"wall_minutes": 63.0, "data_minutes": 1.0, "train_minutes": 60.0})
