"""Atomic writes for benchmark outputs: a reader sees the old file or the complete new one."""
from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pandas as pd


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path` (same suffix); it replaces `path` if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=path.suffix)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; results are for everyone to read
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def write_csv(df: pd.DataFrame, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        df.to_csv(tmp, index=False)
