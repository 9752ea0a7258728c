"""Content hashes of file sets: what the extension was built from, what a record was trained with."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path


def files_under(folder: Path) -> list[Path]:
    """Every file below `folder`, sorted, without Python's byte-code caches."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def tree_sha256(files: Iterable[Path], root: Path) -> str:
    """sha256 over each file's path relative to `root` and its content: renaming a file changes it."""
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()
