"""Find and load the built operator library (once per process), and refuse GPUs it has no
CUDA kernels for."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from .arch import missing_kernels
from .builder import SO_NAME, build, sources_sha256

# dpstudy.study.outputs.EXT_DIR (a test keeps them equal): the workflow runs every job in its
# working directory, so the path is relative to that, not to where the package is installed.
DEFAULT_DIR = "results/ext"
_loaded: Path | None = None


def default_dir() -> Path:
    """$DPSTUDY_EXT_DIR, else results/ext in the working directory."""
    return Path(os.environ.get("DPSTUDY_EXT_DIR") or DEFAULT_DIR)


def load_library(out_dir: str | Path | None = None) -> Path:
    """Load `out_dir`/dpstudy_ext.so into this process, building it first if absent.

    Without `out_dir`, whichever library is already loaded serves (ops.py relies on that).
    """
    global _loaded
    out = Path(out_dir) if out_dir else default_dir()
    so = (out / SO_NAME).resolve()
    if _loaded is not None:
        # The `dpstudy` namespace can be registered once per process: keep the first library.
        if out_dir is not None and so != _loaded:
            print(f"dpstudy.ext: already loaded {_loaded}; not loading {so}", file=sys.stderr)
        return _loaded
    if not so.exists():
        build(out)
    elif _stale(out / "build.json"):
        print(
            f"dpstudy.ext: {so} was built from older sources; rebuild with `python scripts/build_ext.py --out {out}`",
            file=sys.stderr,
        )
    import torch

    built_for = _built_for(out / "build.json")
    if built_for not in (None, torch.__version__):
        # A library links against one torch's symbols: loading it into another fails with an
        # undefined symbol, or worse. Say what to do instead.
        raise ExtensionMismatch(
            f"{so} was built for torch {built_for}, but this is torch {torch.__version__}: "
            f"rebuild it (`python scripts/build_ext.py --out {out}`, or rerun the study: its "
            "build_ext rule reruns when torch changes)"
        )
    torch.ops.load_library(str(so))
    _loaded = so
    return so


class ExtensionMismatch(RuntimeError):
    """The built library belongs to another torch than the one running."""


def _built_for(build_json: Path) -> str | None:
    try:
        return json.loads(build_json.read_text()).get("torch")
    except (OSError, ValueError):
        return None


def _stale(build_json: Path) -> bool:
    try:
        return json.loads(build_json.read_text()).get("sources_sha256") != sources_sha256()
    except (OSError, ValueError):
        return True


class MissingKernels(RuntimeError):
    """The loaded library has no CUDA kernels for a GPU this process drives; the message says why."""


def check_kernels(devices: Iterable[int]) -> None:
    """Raise MissingKernels, with the reason, unless the loaded library's kernels (its build.json)
    run on every CUDA device in `devices`: a clear refusal before training, not a launch error
    (or a silent fallback) in the middle of it."""
    import torch

    folder = (_loaded or load_library()).parent
    build_info = _read_build(folder / "build.json")
    for index in devices:
        reason = missing_kernels(
            build_info, torch.cuda.get_device_capability(index), _shown(folder), torch.cuda.get_device_name(index)
        )
        if reason:
            raise MissingKernels(reason)


def _read_build(build_json: Path) -> dict | None:
    try:
        return json.loads(build_json.read_text())
    except (OSError, ValueError):
        return None


def _shown(folder: Path) -> str:
    """`folder` relative to the working directory when inside it (results/ext), else absolute."""
    try:
        return str(folder.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(folder)
