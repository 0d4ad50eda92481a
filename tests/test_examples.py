"""Every script in examples/ runs, through its own ``main(argv)``, on tiny random models saved as local folders.

Where an example has an invariant, the test checks it: greedy fp32 text through any entry point (generate
with an assistant, the pipeline, the batched engine, the server, a freshly trained drafter) is the
target's own greedy text, and every draft source reproduces the plain output. One test checks that no
example is left without a test here.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from serving.fake_scheduler import tiny_chat_models, tiny_chat_tokenizer

from adaflash_hf import load_target

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
FP32 = ["--dtype", "fp32"]

# The tiny target falls into loops after a few dozen tokens, so suffix matches get drafts accepted (tau > 1)
# and the equalities below cover accepted and rejected drafts alike.
PROMPT, NEW_TOKENS = "Hello, wörld!", 48


@pytest.fixture(autouse=True)
def verify_whole_proposals(monkeypatch):
    """The default verify-length policy weighs measured timings, which vary on a busy machine and may take
    plain steps throughout, leaving no draft to check: here every round proposes and every proposal is verified
    whole."""
    from adaflash_hf import GoodputVerifyLength

    def whole(self, rates, draft_hidden_states, sources=None):  # rates: (rows, longest proposal)
        return torch.full((rates.shape[0],), rates.shape[1] + 1, dtype=torch.long)

    monkeypatch.setattr(GoodputVerifyLength, "verify_lens", whole)
    monkeypatch.setattr(
        GoodputVerifyLength, "wants_drafts", lambda self, rows: True
    )  # nor does its guard hold plain steps


def load_example(name: str):
    """examples/<name>.py imported by path (examples/ is no package)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_example(name: str, argv: list[str]) -> None:
    load_example(name).main(argv)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    """Folders of a tiny Llama target (with a chat template and a spare special token for MASK) and a drafter."""
    root = tmp_path_factory.mktemp("models")
    tokenizer = tiny_chat_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<mask>"]})
    target, drafter, _ = tiny_chat_models(tokenizer, num_layers=4)
    target.save_pretrained(root / "target")
    tokenizer.save_pretrained(root / "target")
    drafter.save_pretrained(root / "drafter")
    return {"target": str(root / "target"), "drafter": str(root / "drafter")}


def greedy_text(target_dir: str, prompt: str, max_new_tokens: int, chat: bool = True) -> str:
    """The target's own greedy continuation in fp32, decoded as the examples decode it."""
    target, tokenizer = load_target(target_dir, dtype="fp32")
    if chat:
        inputs = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
    else:
        inputs = tokenizer(prompt, return_tensors="pt")
    out = target.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    text = tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert len(text) >= 10, "the reference is too short to tell outputs apart"
    return text


def model_args(models: dict[str, str]) -> list[str]:
    return ["--target", models["target"], "--drafter", models["drafter"], *FP32]


def test_generate(models, capsys):
    run_example("generate", [*model_args(models), "--prompt", PROMPT, "--max-new-tokens", str(NEW_TOKENS)])
    answer, stats = capsys.readouterr().out.rsplit("\ntau ", 1)
    assert answer.rstrip("\n") == greedy_text(models["target"], PROMPT, NEW_TOKENS)
    assert float(stats.split(",")[0]) > 1.0


def test_pipeline_chat(models, capsys):
    run_example("pipeline_chat", [PROMPT, *model_args(models), "--max-new-tokens", str(NEW_TOKENS)])
    streamed, stats = capsys.readouterr().out.rsplit("\ntau ", 1)
    assert streamed.rstrip("\n") == greedy_text(models["target"], PROMPT, NEW_TOKENS)
    assert float(stats) > 1.0


def test_batched_generation(models, capsys):
    example = load_example("batched_generation")
    example.main([*model_args(models), "--max-new-tokens", str(NEW_TOKENS)])
    answers, stats = capsys.readouterr().out.rsplit("\ntau ", 1)
    for question in example.QUESTIONS:  # each row of the ragged batch is that prompt's own greedy answer
        assert f"### {question}\n{greedy_text(models['target'], question, NEW_TOKENS)}\n" in answers
    assert float(stats.split(",")[0]) > 1.0


def test_draft_sources(models, capsys):
    run_example("draft_sources", [*model_args(models), "--max-new-tokens", str(NEW_TOKENS), "--prompt", PROMPT])
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows.keys() == {"plain", "hybrid", "drafter", "suffix"}  # no datastore in the tiny drafter's folder
    assert all(row[4] == "yes" for row in rows.values())  # every draft source reproduces the plain output
    assert float(rows["suffix"][3]) > 1.0


def test_serve_and_query(models, capsys):
    pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    question = "Emoji 🙂 please"
    run_example("serve_and_query", [*model_args(models), "--max-tokens", "16", "--question", question])
    sections = capsys.readouterr().out.split("\n## ")
    completion, chat, streamed = (section.split("\n", 1)[1].rsplit("\n[adaflash] ", 1) for section in sections[1:])
    assert completion[0] == greedy_text(models["target"], "def fibonacci(n):", 16, chat=False)
    want = greedy_text(models["target"], question, 16)
    assert chat[0] == want and streamed[0] == want  # the server answers what offline generate does
    metrics = [
        dict(item.split(" ") for item in line.split("\n")[0].split(", ")) for _, line in (completion, chat, streamed)
    ]
    assert all(m["num_tokens"] == "16" for m in metrics)
    assert float(metrics[2]["mean_accepted_length"]) > 1.0  # the repeated question: drafts from the global index
    assert streamed[1].rstrip().endswith("server stopped")


def test_train_drafter_for_another_target(models, tmp_path, capsys):
    output_dir = tmp_path / "run"
    tiny_run = [
        "--target",
        models["target"],
        "--output-dir",
        str(output_dir),
        "--target-dtype",
        "fp32",
        "--block-size",
        "4",
        "--num-anchors",
        "8",
        "--seq-len",
        "32",
        "--train-domains",
        "math",
        "--corpus-limit-per-domain",
        "4",
        "--self-gen-prompts-per-domain",
        "2",
        "--eval-prompts-per-domain",
        "2",
        "--gen-max-new-tokens",
        "6",
        "--gen-batch-size",
        "2",
        "--eval-anchors",
        "4",
        "--warmup-steps",
        "1",
        "--engine-eval-prompts",
        "0",
        "--max-steps",
        "3",
    ]
    run_example(
        "train_drafter_for_another_target", [*tiny_run, "--prompt", PROMPT, "--max-new-tokens", str(NEW_TOKENS)]
    )
    summary = json.loads((output_dir / "drafter" / "training_summary.json").read_text())
    assert summary["steps"] == 3 and summary["recipe"]["max_minutes"] == 60  # the example's default, kept
    out = capsys.readouterr().out
    assert "block 4, reads target layers [0, 1, 2, 3]" in out
    assert f"\n{greedy_text(models['target'], PROMPT, NEW_TOKENS)}\n\ntau " in out  # lossless with the new drafter


def test_online_distillation(models, tmp_path, capsys):
    from adaflash_hf import load_drafter

    publish, merged = tmp_path / "adapters", tmp_path / "merged"
    run_example(
        "online_distillation",
        [
            *model_args(models),
            "--requests",
            "6",
            "--max-new-tokens",
            "24",
            "--report-every",
            "3",
            "--min-trajectories",
            "2",
            "--steps-per-version",
            "1",
            "--lr",
            "1e-2",
            "--publish-dir",
            str(publish),
            "--merged-dir",
            str(merged),
            "--check",
        ],
    )
    out = capsys.readouterr().out
    reports = [line for line in out.splitlines() if line.startswith("request ")]
    assert [line.split(":")[0] for line in reports] == ["request    3", "request    6"]
    assert "recorded 6" in reports[-1]  # every generate call was recorded, at no extra target pass
    assert "answers equal to the target's own: 6/6" in out  # lossless while adapters train and swap
    assert "errors: none" in out
    if "merged adapter v" in out:  # a version was published in time (the trainer runs beside the requests)
        version = int(out.split("merged adapter v")[1].split()[0])
        assert (publish / "LATEST").read_text().strip() == str(version)
        target, _ = load_target(models["target"], dtype="fp32")
        assert load_drafter(str(merged), target).config.block_size == 4  # the merged folder loads like any drafter


def test_every_example_is_a_documented_main_with_a_test_here():
    names = sorted(path.stem for path in EXAMPLES.glob("*.py"))
    assert names, f"no examples found in {EXAMPLES}"
    untested = [name for name in names if f"test_{name}" not in globals()]
    assert not untested, f"examples without a test_<name> in {__file__}: {untested}"
    for name in names:
        source = (EXAMPLES / f"{name}.py").read_text()
        assert source.startswith('"""') and "python examples/" in source.split('"""')[1], (
            f"{name}: docstring with how to run it"
        )
        assert (
            "def main(argv: list[str] | None = None)" in source and 'if __name__ == "__main__":\n    main()' in source
        ), name
