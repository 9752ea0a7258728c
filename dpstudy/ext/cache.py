"""A machine-wide cache of built libraries, keyed by everything that goes into one.

Every study folder builds the extension into its own results/ext, and most of those builds on a
machine compile the same sources with the same torch, compiler, flags and CUDA plan: minutes of
compiler each time (with CUDA kernels, several). The first build stores its library under the
key of its inputs; a later one with the same key, in any folder, copies it instead of compiling.
Two builds of one key at once compile once: the second waits on the entry's lock.

DPSTUDY_EXT_CACHE names the folder (default $XDG_CACHE_HOME/dpstudy/ext, else
~/.cache/dpstudy/ext); `off` turns the cache off. `scripts/build_ext.py --force` compiles anew
and replaces the entry. The test suite points it at a folder of its own run, so that every run
compiles once.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dpstudy.util.atomic import write_json
from dpstudy.util.cachedir import user_cache

ENV = "DPSTUDY_EXT_CACHE"
LIBRARY = "library.so"  # an entry's copy of the library, whatever the build calls it


def folder() -> Path | None:
    """The cache folder, or None when DPSTUDY_EXT_CACHE is `off`."""
    return user_cache(ENV, "ext")


def key(inputs: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:32]


@contextlib.contextmanager
def entry(inputs: dict[str, Any]) -> Iterator[Path | None]:
    """The entry folder of `inputs`, locked for the body (None with the cache off, or where the
    cache folder cannot be made: the build then compiles as if there were none)."""
    root = folder()
    if root is None:
        yield None
        return
    path = root / key(inputs)
    try:
        path.mkdir(parents=True, exist_ok=True)
        lock = open(path / "lock", "w")
    except OSError:
        yield None
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield path


def lookup(path: Path, inputs: dict[str, Any]) -> dict[str, Any] | None:
    """The stored build.json of an entry whose library is present and whose inputs match."""
    try:
        info = json.loads((path / "build.json").read_text())
    except (OSError, ValueError):
        return None
    if info.get("inputs") != inputs or not (path / LIBRARY).exists():
        return None
    return info


def store(path: Path, so: Path, info: dict[str, Any], inputs: dict[str, Any]) -> None:
    """Copy the library in, then build.json: an entry without build.json is never used."""
    tmp = path / f".{LIBRARY}.{os.getpid()}.tmp"
    shutil.copy2(so, tmp)
    os.replace(tmp, path / LIBRARY)
    write_json(path / "build.json", {**info, "inputs": inputs})


def copy_out(path: Path, dest: Path) -> None:
    """The entry's library to `dest`, replaced by a rename (processes that mapped the old file keep it)."""
    tmp = dest.parent / f".{dest.name}.{os.getpid()}.tmp"
    shutil.copy2(path / LIBRARY, tmp)
    os.replace(tmp, dest)
