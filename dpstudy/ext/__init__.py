"""dpstudy's C++/CUDA operators (namespace `dpstudy`): rgb_to_grayscale, conv2d, max_pool2d.

    dpstudy.ext.build("results/ext")    # compile, write results/ext/build.json
    ops = dpstudy.ext.load()            # load the library (building it if absent)
    ops.conv2d(x, w, b, stride=1, padding=1)   # or torch.ops.dpstudy.conv2d(...)

See README.md beside this file for the operators' contracts and the build.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from .builder import build
from .loader import default_dir, load_library

__all__ = ["build", "load", "default_dir"]


def load(out_dir: str | Path | None = None) -> ModuleType:
    """Load the built library from `out_dir` (default: $DPSTUDY_EXT_DIR or results/ext), building
    it first if absent, and return `dpstudy.ext.ops` with the Python wrappers."""
    load_library(out_dir)
    from . import ops  # registers autograd and fake kernels; needs the library loaded

    return ops
