"""The adaptive length head: Hub round trips, the survival loss, the verify-length policy, training, losslessness."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModel

import adaflash_hf
from adaflash_hf import AdaFlashDrafter, DraftingConfig, generate
from adaflash_hf.configuration_length_head import AdaFlashLengthHeadConfig
from adaflash_hf.decoding.cost import VerifyCostModel
from adaflash_hf.decoding.policy import FixedVerifyLength, GoodputVerifyLength, LengthHeadVerifyLength
from adaflash_hf.modeling_length_head import AdaFlashLengthHead, register
from adaflash_hf.training.configs import TrainLengthHeadConfig
from adaflash_hf.training.length_head import load_length_head, train_length_head
from adaflash_hf.training.length_head_fit import calibration, expected_accepted, survival_loss, survival_targets
from adaflash_hf.training.length_head_records import AlwaysDraftState, RecordingVerifyLength

from conftest import greedy_reference, left_pad, random_prompts

BUNDLED = Path(adaflash_hf.__file__).parent / "bundled"


def tiny_head(hidden_size: int = 64, block_size: int = 5, seed: int = 0) -> AdaFlashLengthHead:
    torch.manual_seed(seed)
    head = AdaFlashLengthHead(
        AdaFlashLengthHeadConfig(hidden_size=hidden_size, block_size=block_size, head_size=16)
    ).eval()
    with torch.no_grad():  # spread the predictions, so verify lengths differ between rounds
        for p in head.parameters():
            p.normal_(0, 0.5)
    return head


def same_outputs(a, b, hidden) -> bool:
    prior = torch.rand(hidden.shape[0], hidden.shape[1] - 1)
    with torch.no_grad():
        return torch.equal(a(hidden, prior).logits, b(hidden, prior).logits)


# ---------------------------------------------------------------------------------------------- Hub files


def test_save_load_round_trip_and_remote_code(tmp_path):
    head = tiny_head()
    head.save_pretrained(tmp_path)
    assert {"config.json", "model.safetensors", "modeling_length_head.py", "configuration_length_head.py"} <= {
        p.name for p in tmp_path.iterdir()
    }
    config = json.loads((tmp_path / "config.json").read_text())
    assert (
        config["model_type"] == "adaflash_length_head"
        and config["auto_map"]["AutoModel"] == "modeling_length_head.AdaFlashLengthHead"
    )
    hidden = torch.randn(3, 5, 64)
    assert same_outputs(AdaFlashLengthHead.from_pretrained(tmp_path), head, hidden)
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    remote_class = get_class_from_dynamic_module("modeling_length_head.AdaFlashLengthHead", str(tmp_path))
    assert remote_class is not AdaFlashLengthHead  # the saved Hub file, as trust_remote_code runs it
    assert same_outputs(remote_class.from_pretrained(tmp_path), head, hidden)
    assert same_outputs(AutoModel.from_pretrained(tmp_path, trust_remote_code=True), head, hidden)
    register()
    assert type(AutoModel.from_pretrained(tmp_path)) is AdaFlashLengthHead


def test_hub_files_import_only_torch_and_transformers():
    """The Hub copies run as remote code where adaflash_hf is not installed."""
    import ast

    library = Path(adaflash_hf.__file__).parent
    for name in ("modeling_length_head.py", "configuration_length_head.py"):
        tree = ast.parse((library / name).read_text())
        modules = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        modules |= {("." * n.level) + (n.module or "") for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        roots = {m.split(".")[0] for m in modules if not m.startswith(".")}
        assert roots <= {"__future__", "dataclasses", "torch", "transformers"}, (name, roots)
        assert {m for m in modules if m.startswith(".")} <= {".configuration_length_head"}, name


def test_bundled_head_is_current_and_fits_the_bundled_drafter():
    library = Path(adaflash_hf.__file__).parent
    folders = sorted(BUNDLED.glob("*-length-head"))
    assert folders, "no bundled length head"
    for folder in folders:
        for name in ("modeling_length_head.py", "configuration_length_head.py"):
            assert (folder / name).read_text() == (library / name).read_text(), f"{folder / name} is stale: re-save it"
        card = (folder / "README.md").read_text()
        assert card.startswith("---\nbase_model: ") and "library_name: transformers" in card.split("---")[1]
        preset = folder.name.removesuffix("-length-head")
        drafter_config = json.loads((BUNDLED / preset / "config.json").read_text())
        head = load_length_head("auto", target_name=preset)
        assert (head.config.hidden_size, head.config.block_size) == (
            drafter_config["hidden_size"],
            drafter_config["block_size"],
        )
        assert sum(p.stat().st_size for p in folder.glob("*.safetensors")) < 5 * 2**20


# ---------------------------------------------------------------------------------------------- loss and calibration


def test_survival_targets_mark_drafts_at_risk():
    labels, mask = survival_targets(torch.tensor([0, 2, 4, 1]), torch.tensor([4, 4, 4, 1]), 4)
    assert mask.tolist() == [
        [True, False, False, False],
        [True, True, True, False],
        [True] * 4,
        [True, False, False, False],
    ]
    assert labels.tolist()[1] == [1, 1, 0, 0] and labels.tolist()[3] == [1, 0, 0, 0]


def test_survival_loss_ignores_censored_positions():
    """Logits after the first rejection or past the verified drafts carry no label: they change neither loss nor
    gradient."""
    accepted, verified = torch.tensor([1, 3, 0, 2]), torch.tensor([6, 3, 6, 2])
    logits = torch.randn(4, 6, requires_grad=True)
    loss = survival_loss(logits, accepted, verified)
    loss.backward()
    _, at_risk = survival_targets(accepted, verified, 6)
    assert (logits.grad[~at_risk] == 0).all() and (logits.grad[at_risk] != 0).all()
    scrambled = logits.detach().clone()
    scrambled[~at_risk] = torch.randn(int((~at_risk).sum())) * 100
    assert torch.allclose(survival_loss(scrambled, accepted, verified), loss)
    # the mean BCE over the at-risk drafts only
    manual = torch.nn.functional.binary_cross_entropy_with_logits(
        logits.detach()[at_risk], survival_targets(accepted, verified, 6)[0][at_risk]
    )
    assert torch.allclose(loss, manual)


def test_calibration_of_a_perfect_predictor_and_expected_length():
    accepted, verified = torch.tensor([0, 2, 3]), torch.tensor([3, 3, 3])
    labels, _ = survival_targets(accepted, verified, 3)
    perfect = calibration(labels, accepted, verified)
    assert perfect["log_loss"] < 1e-3 and perfect["length_mae"] == 0
    half = calibration(torch.full((3, 3), 0.5), accepted, verified)
    assert half["log_loss"] == pytest.approx(0.6931, abs=1e-4) and half["brier"] == pytest.approx(0.25)
    assert expected_accepted(torch.full((1, 3), 0.5)).item() == pytest.approx(0.5 + 0.25 + 0.125)
    assert expected_accepted(torch.full((1, 3), 0.5), torch.tensor([1])).item() == pytest.approx(0.5)


def test_expected_length_and_adaflash_rule():
    head = tiny_head()
    hidden, prior = torch.randn(4, 5, 64), torch.rand(4, 4)
    rates = head(hidden, prior).rates
    assert torch.allclose(head.expected_accepted_length(hidden, prior), rates.cumprod(-1).sum(-1))
    lengths = head.adaflash_verify_len(hidden, prior, min_len=2)
    assert ((lengths >= 2) & (lengths <= 5)).all()
    assert torch.equal(lengths, ((1 + rates.cumprod(-1).sum(-1)) * 1.3).round().long().clamp(2, 5))


# ---------------------------------------------------------------------------------------------- policy


def test_policy_uses_head_only_for_drafter_rows():
    head = tiny_head()
    hidden = torch.randn(3, 5, 64, dtype=torch.bfloat16)  # the engine's drafter may run in bf16; the head is fp32
    rates = torch.rand(3, 6)  # proposals may be longer than the block (suffix rows)
    policy = LengthHeadVerifyLength(head, cost_model=VerifyCostModel(prior_slope=0.0))
    replaced = policy.head_rates(rates, hidden, ["drafter", "suffix", "drafter"])
    expected = head(hidden[[0, 2]].float(), rates[[0, 2], :4]).rates  # the estimator's rates are the head's prior
    assert torch.allclose(replaced[[0, 2], :4], expected) and torch.equal(replaced[[0, 2], 4:], rates[[0, 2], 4:])
    assert torch.equal(replaced[1], rates[1])

    with torch.no_grad():
        head.out.weight.zero_()
        head.out.bias.fill_(30.0)  # the head is sure every draft is accepted
    rates = torch.zeros(3, 6)  # the estimator expects nothing
    assert policy.verify_lens(rates, hidden, ["suffix", "none", "global"]).tolist() == [
        1,
        1,
        1,
    ]  # estimator's rates kept
    assert policy.verify_lens(rates, hidden, ["drafter", "suffix", "none"]).tolist() == [5, 5, 5]
    assert policy.verify_lens(rates, None, None).tolist() == [1, 1, 1]  # no drafter ran: nothing to read
    assert policy.verify_lens(rates, hidden).tolist() == [5, 5, 5]  # sources unknown: the drafter's rows


def test_policy_lengths_stay_in_range_and_follow_cost():
    head = tiny_head()
    for seed in range(5):
        g = torch.Generator().manual_seed(seed)
        b, m = int(torch.randint(1, 5, (1,), generator=g)), int(torch.randint(1, 9, (1,), generator=g))
        hidden = torch.randn(b, 5, 64, generator=g)
        for slope in (0.0, 0.05, 1.0):
            lengths = LengthHeadVerifyLength(head, VerifyCostModel(prior_slope=slope)).verify_lens(
                torch.rand(b, m, generator=g), hidden
            )
            assert lengths.dtype == torch.long and ((lengths >= 1) & (lengths <= m + 1)).all()
    steep = LengthHeadVerifyLength(head, VerifyCostModel(prior_slope=10.0))
    assert steep.verify_lens(torch.rand(2, 4), torch.randn(2, 5, 64)).tolist() == [1, 1]  # drafts never pay
    capped = LengthHeadVerifyLength(head, VerifyCostModel(prior_slope=0.0), max_verify_len=3)
    assert capped.verify_lens(torch.rand(2, 4), torch.randn(2, 5, 64)).tolist() == [3, 3]


def test_existing_policies_accept_and_ignore_sources():
    rates = torch.full((2, 4), 0.9)
    assert FixedVerifyLength(3).verify_lens(rates, None, ["suffix", "drafter"]).tolist() == [3, 3]
    goodput = GoodputVerifyLength(cost_model=VerifyCostModel(prior_slope=0.0))
    assert (
        goodput.verify_lens(rates, None, ["suffix", "drafter"]).tolist()
        == goodput.verify_lens(rates, None).tolist()
        == [5, 5]
    )


def test_generate_with_the_length_head_is_lossless(target, drafter):
    """fp32 greedy output with head-chosen verify lengths equals the target's own generate, row by row."""
    prompts = random_prompts((3, 8, 5), seed=4)
    ids, mask = left_pad(prompts)
    head = tiny_head(hidden_size=drafter.config.hidden_size, block_size=drafter.config.block_size)
    policy = LengthHeadVerifyLength(head, cost_model=VerifyCostModel(prior_slope=0.05))
    out = generate(
        target,
        drafter,
        ids,
        mask,
        max_new_tokens=14,
        eos_token_id=None,
        verify_policy=policy,
        drafting=DraftingConfig.only("drafter"),
        drafting_state=AlwaysDraftState(),
    )
    rows = [row[ids.shape[1] : ids.shape[1] + n] for row, n in zip(out.sequences.tolist(), out.num_new_tokens)]
    assert rows == [greedy_reference(target, p, 14, eos=False)[len(p) :] for p in prompts]
    assert len({v for r in out.stats.rounds for v in r.verify_lens}) > 1  # the head did choose


def test_recording_policy_keeps_one_record_per_verified_row(target, drafter):
    prompts = random_prompts((4, 7), seed=1)
    ids, mask = left_pad(prompts)
    recorder = RecordingVerifyLength()
    out = generate(
        target,
        drafter,
        ids,
        mask,
        max_new_tokens=9,
        eos_token_id=None,
        verify_policy=recorder,
        drafting=DraftingConfig.only("drafter"),
        drafting_state=AlwaysDraftState(),
    )
    hidden, rates, accepted, verified = recorder.pop_records()
    rounds = [(a, v - 1) for r in out.stats.rounds for a, v in zip(r.accept_lengths, r.verify_lens) if v > 1]
    assert [(int(a), int(v)) for a, v in zip(accepted, verified)] == rounds
    assert hidden.shape == (len(rounds), drafter.config.block_size, drafter.config.hidden_size)
    assert (
        rates.shape == (len(rounds), drafter.config.block_size - 1)
        and (verified <= drafter.config.block_size - 1).all()
    )


# ---------------------------------------------------------------------------------------------- training and loading


def test_training_smoke_writes_a_loadable_head_and_reuses_records(tmp_path, monkeypatch):
    from datasets import Dataset
    from test_training import chat_target

    import adaflash_hf.data
    import adaflash_hf.decoding.engine as engine

    target, tokenizer = chat_target(layers=4)
    torch.manual_seed(0)
    drafter = AdaFlashDrafter.from_target(target, num_layers=1, block_size=4).eval()

    def fake_prompts(domains, split, limit_per_domain, seed=0):  # short prompts keep the smoke run fast
        texts = [f"{split} question {i}: what is {i} + {i}?" for i in range(limit_per_domain)]
        return Dataset.from_dict({"prompt": texts, "domain": ["math"] * len(texts)})

    monkeypatch.setattr(adaflash_hf.data, "load_prompts", fake_prompts)
    config = TrainLengthHeadConfig(
        output_dir=str(tmp_path / "run"),
        target="tiny",
        target_dtype="fp32",
        drafter="fresh",
        train_prompts_per_domain=6,
        eval_prompts_per_domain=2,
        max_new_tokens=6,
        batch_size=3,
        epochs=2,
        head_size=16,
    )
    summary = train_length_head(config, target, tokenizer, drafter)
    assert summary["records"]["train"] > 0 and summary["records"]["held_out"] > 0
    assert {"length_head", "engine_estimator", "estimator_features_refit", "position_only"} <= summary[
        "held_out"
    ].keys()
    head = load_length_head(str(tmp_path / "run" / "length_head"), drafter)
    assert head.config.block_size == 4 and head(torch.randn(1, 4, 32), torch.rand(1, 3)).rates.shape == (1, 3)
    card = (tmp_path / "run" / "length_head" / "README.md").read_text()
    assert "adaflash train-length-head" in card and f"{summary['held_out']['length_head']['log_loss']:.4f}" in card

    def no_decoding(*args, **kwargs):
        raise AssertionError("records are cached: nothing should be decoded again")

    monkeypatch.setattr(engine, "generate", no_decoding)
    again = train_length_head(config, target, tokenizer, drafter)
    assert again["records"] == summary["records"]


def test_clear_errors_for_a_head_that_does_not_fit(target, drafter, tmp_path):
    tiny_head(hidden_size=32, block_size=drafter.config.block_size).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="drafter has hidden size 64"):
        load_length_head(str(tmp_path), drafter)
    with pytest.raises(ValueError, match=r"\(b, 5, 32\)"):
        AdaFlashLengthHead.from_pretrained(tmp_path)(torch.randn(1, 5, 64), torch.rand(1, 4))
    with pytest.raises(ValueError, match="one rate per draft"):
        AdaFlashLengthHead.from_pretrained(tmp_path)(torch.randn(1, 5, 32), torch.rand(1, 3))
    with pytest.raises(ValueError, match="No length head is bundled for 'tiny'"):
        load_length_head("auto", drafter, target_name="tiny")
    with pytest.raises(ValueError, match="head_dtype"):
        TrainLengthHeadConfig(head_dtype="fp8")


def test_length_head_loading_errors_say_what_is_wrong(tmp_path):
    from adaflash_hf.training.length_head import load_length_head

    with pytest.raises(FileNotFoundError, match="no length head folder .*a local folder with config.json"):
        load_length_head(str(tmp_path / "missing"))
    tiny_head().save_pretrained(tmp_path / "head")
    (tmp_path / "head" / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(OSError, match="length head weights .* cannot be read.*corrupt or was only partly downloaded"):
        load_length_head(str(tmp_path / "head"))
