"""Resuming a drafter training run when its newest checkpoint cannot be read."""

import pytest
import torch

from adaflash_hf.training.checkpointing import load_latest_checkpoint, read_checkpoint


def _write(run, step: int, payload: bytes | None = None):
    folder = run / "checkpoints" / f"step_{step}"
    folder.mkdir(parents=True)
    if payload is None:
        torch.save({"state": {"step": step}}, folder / "checkpoint.pt")
    else:
        (folder / "checkpoint.pt").write_bytes(payload)
    return folder


def test_a_run_without_checkpoints_starts_fresh(tmp_path):
    assert load_latest_checkpoint(tmp_path) is None


def test_an_unreadable_newest_checkpoint_falls_back_to_the_one_before(tmp_path, caplog):
    older = _write(tmp_path, 2)
    newest = _write(tmp_path, 3)
    (newest / "checkpoint.pt").write_bytes((newest / "checkpoint.pt").read_bytes()[:40])  # a truncated copy
    with caplog.at_level("WARNING", logger="adaflash_hf.training.checkpointing"):
        path, ckpt = load_latest_checkpoint(tmp_path)
    assert path == older and ckpt["state"]["step"] == 2
    assert "step_3" in caplog.text and "cannot be read" in caplog.text


def test_no_readable_checkpoint_is_a_clear_error_not_a_fresh_start(tmp_path):
    _write(tmp_path, 2, b"not a checkpoint")
    _write(tmp_path, 4, b"")
    with pytest.raises(ValueError, match=r"no checkpoint under .* can be read .*--no-resume"):
        load_latest_checkpoint(tmp_path)
    with pytest.raises(ValueError, match="missing, truncated or corrupt"):
        read_checkpoint(tmp_path / "checkpoints" / "step_9")  # no such folder
