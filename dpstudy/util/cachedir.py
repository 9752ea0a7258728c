"""Where dpstudy keeps what it can make again, machine-wide (built extensions, import closures)."""

from __future__ import annotations

import os
from pathlib import Path


def user_cache(env: str, name: str) -> Path | None:
    """The folder `env` names, else $XDG_CACHE_HOME/dpstudy/<name> (~/.cache by default); None
    when `env` is `off`."""
    chosen = os.environ.get(env, "")
    if chosen.lower() == "off":
        return None
    if chosen:
        return Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "dpstudy" / name
