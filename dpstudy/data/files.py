"""A prepared dataset's files: tensors saved atomically, and their checksums."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from dpstudy.util.atomic import atomic_output


def save_atomic(path: Path, obj: Any) -> None:
    """torch.save to a temporary name, renamed into place: a killed run leaves no half a file."""
    import torch

    with atomic_output(path) as tmp:
        torch.save(obj, tmp)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
