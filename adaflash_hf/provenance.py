"""Provenance of results: which adaflash-hf code (version, install location, git commit) produced them.

Every command that writes a JSON result (bench, quality, profile, loadtest, OPD bench) records
``code_provenance()`` in it, so a number can be traced back to the code that measured it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from . import __version__


def code_provenance() -> dict:
    """Which adaflash-hf code produced a result: version, install location and git commit (if any)."""
    root = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain", "--", "."], cwd=root, capture_output=True, text=True, timeout=10
            ).stdout.strip()
        )
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "", False
    return {
        "version": __version__,
        "package_dir": str(root),
        "git_commit": commit or None,
        "git_dirty": dirty if commit else None,
    }
