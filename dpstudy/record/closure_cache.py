"""Import closures (dpstudy.record.provenance.closure) kept on disk between processes.

Reading every module's imports is an ast.parse of ~90 files, about 0.2 s of CPU, and every rank,
every launcher that writes a record and every Snakemake start needs it. A closure depends only on
the files it may read: its roots and the files of the package. It is kept under a key of their
paths, sizes and modification times (a stat of ~200 files, ~2 ms), so an edit, a new module or a
new data file makes a new key and the closure is read afresh.

DPSTUDY_CODE_CACHE names the folder (default $XDG_CACHE_HOME/dpstudy/closures, else
~/.cache/dpstudy/closures); `off` turns the cache off. Entries not used for KEEP_DAYS go when a
new one is written; a folder that cannot be written only means the closure is read each time.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from dpstudy.util.cachedir import user_cache

ENV = "DPSTUDY_CODE_CACHE"
KEEP_DAYS = 14


def state_key(starts: list[Path | None], package: Path) -> str:
    """sha256 over the path, size and modification time of the roots and of every file of the package."""
    digest = hashlib.sha256(str(package).encode())
    paths = [p for p in starts if p is not None]
    for top, dirs, files in os.walk(package):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        paths += [Path(top, name) for name in sorted(files)]
    for path in paths:
        st = path.stat()
        digest.update(f"\0{path}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    return digest.hexdigest()[:32]


def entry(starts: list[Path | None], package: Path) -> Path | None:
    """The entry of this state (None with the cache off, or where a file vanished as it was read)."""
    root = user_cache(ENV, "closures")
    try:
        return None if root is None else root / f"{state_key(starts, package)}.json"
    except OSError:
        return None


def lookup(path: Path | None) -> list[Path] | None:
    """The closure stored in entry `path`, or None."""
    try:
        found = [Path(p) for p in json.loads(path.read_text())] if path else None
    except (OSError, ValueError):
        return None
    if found is not None:
        os.utime(path)  # used: kept another KEEP_DAYS
    return found


def store(path: Path | None, found: list[Path]) -> None:
    """Keep `found` in entry `path` (atomically: a reader sees a whole entry or none); then drop
    entries unused for KEEP_DAYS."""
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps([str(p) for p in found]))
        os.replace(tmp, path)
        old = time.time() - KEEP_DAYS * 86400
        for other in path.parent.iterdir():  # half-written ones of killed processes too
            if other.stat().st_mtime < old:
                other.unlink(missing_ok=True)
    except OSError:
        pass
