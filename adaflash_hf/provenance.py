"""Provenance of results: which adaflash-hf code (version, install location, git commit) produced them, and on
which machine.

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


def machine_summary() -> str:
    """The CPU model, its architecture and the instruction sets bf16 speed depends on (AMX, AVX512-BF16, AVX2)."""
    import platform

    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    flags = set(next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), []))
    features = [f for f in ("amx_bf16", "avx512_bf16", "avx2") if f in flags]
    return f"{model or platform.processor()} ({', '.join([platform.machine(), *features])})"


def script_provenance(command: str, machine_note: str = "") -> dict:
    """The ``provenance`` block a benchmark script writes: its command line, the machine (with ``machine_note``,
    e.g. ``"idle"``), the code's short commit (``plus uncommitted changes`` if the tree was dirty) and the date.
    ``committed_in`` is added with the commit that publishes the JSON (``benchmarks/README.md``)."""
    import os
    import time

    code = code_provenance()
    commit = (code["git_commit"] or "")[:7] or "unknown"
    if code["git_dirty"]:
        commit += " plus uncommitted changes"
    note = f", {machine_note}" if machine_note else ""
    return {
        "command": command,
        "machine": f"{machine_summary()}, {os.cpu_count()} cores{note}",
        "code_commit": commit,
        "date": time.strftime("%Y-%m-%d"),
    }


def write_script_json(script: str, argv: list[str] | None, args, results) -> None:
    """Write a benchmark script's JSON to ``args.json``: its :func:`script_provenance` (the command is ``python
    script`` with ``argv``, or this process's arguments when None; ``args.machine_note`` after the machine), its
    arguments (a dataclass) and its results; then say so on stderr."""
    import dataclasses
    import json
    import sys
    from pathlib import Path

    command = f"python {script} " + " ".join(sys.argv[1:] if argv is None else argv)
    payload = {"provenance": script_provenance(command, args.machine_note), "args": dataclasses.asdict(args)}
    Path(args.json).write_text(json.dumps({**payload, "results": results}, indent=2) + "\n")
    print(f"[{Path(script).stem.replace('_', '-')}] wrote {args.json}", file=sys.stderr)
