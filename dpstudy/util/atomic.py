"""Atomic outputs: a reader (or Snakemake) sees the old file or the complete new one, never a
half-written one, and a killed writer leaves nothing that looks finished."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_output(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path` (same suffix, so writers that look at it still
    know the format); on success it replaces `path`, on any error it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=f".tmp{path.suffix}")
    os.close(fd)
    os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp makes 0600; outputs get the usual mode
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: str | Path, text: str) -> None:
    with atomic_output(path) as tmp:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())


def write_json(path: str | Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=1) + "\n")


def write_csv(df, path: str | Path) -> None:
    with atomic_output(path) as tmp:
        df.to_csv(tmp, index=False)
