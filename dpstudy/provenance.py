"""Code version of the training code: which finished cells were made with older code.

Only the modules that decide how a cell trains are hashed: editing plots, tables or the report
must not mark every finished cell as stale.
"""
from __future__ import annotations

import functools
import hashlib
import os
import subprocess
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
REPO = PACKAGE.parent
# Everything that changes what a training run measures; paths relative to the repository.
TRAINING_SOURCES = (
    "dpstudy/data.py",
    "dpstudy/synthetic.py",
    "dpstudy/download.py",
    "dpstudy/loaders.py",
    "dpstudy/models",
    "dpstudy/monitor.py",  # peak memory and other processes' load, per epoch
    "dpstudy/outcome.py",  # the summary's throughput (steady window), epoch time and accuracy
    "dpstudy/parallel.py",
    "dpstudy/probe.py",
    "dpstudy/spec.py",
    "dpstudy/train.py",
    "dpstudy/ext/csrc",
    "dpstudy/ext/ops.py",
    "dpstudy/ext/layers.py",
    "scripts/train.py",
)


def training_files() -> list[str]:
    """The training sources that exist, as paths relative to the repository."""
    files: list[Path] = []
    for entry in TRAINING_SOURCES:
        path = REPO / entry
        if path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
        elif path.is_file():
            files.append(path)
    return [str(p.relative_to(REPO)) for p in files]


@functools.cache
def source_hash() -> str:
    """sha256 over the training sources' relative paths and contents (12 hex digits)."""
    digest = hashlib.sha256()
    for path in training_files():
        digest.update(path.encode() + b"\0")
        digest.update((REPO / path).read_bytes() + b"\0")
    return digest.hexdigest()[:12]


@functools.cache
def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"],
            capture_output=True, text=True, timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def code_version() -> dict[str, str | None]:
    return {"git_commit": git_commit(), "source_hash": source_hash()}


def export_checkout(basedir: str) -> None:
    """Make jobs started from here import dpstudy from `basedir` (the workflow's checkout),
    not from wherever the package happens to be installed."""
    paths = [basedir, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ.update(PYTHONPATH=os.pathsep.join(dict.fromkeys(paths)))
