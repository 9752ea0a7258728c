"""Before any job: a study whose cells trace steps (trace_steps; by default every multi-device
cell) needs a PyTorch whose profiler gives what dpstudy.engine.trace_figures reduces: Kineto's
Chrome traces with each operator's category and input shapes (record_shapes), and Gloo's
collectives as spans of their own. The reduction is made and tested for PyTorch 2.0 and later. The
version is read from the installed package's metadata: Snakemake's process imports no torch."""

from __future__ import annotations

import re
from collections.abc import Iterable
from importlib import metadata

from dpstudy.engine.tracing import steps_of
from dpstudy.util.errors import ConfigError

MIN_TORCH = (2, 0)


def torch_version() -> str | None:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def check(cells: Iterable, version: str | None = None) -> None:
    """ConfigError naming trace_steps, a traced cell and the version when this PyTorch's profiler
    cannot give the traces; `version` (tests): the installed torch's unless given."""
    traced = next((cell for cell in cells if steps_of(cell.spec) > 0), None)
    if traced is None:
        return
    version = version or torch_version()
    numbers = tuple(int(n) for n in re.findall(r"\d+", version or "")[:2])
    if version is not None and numbers < MIN_TORCH:
        raise ConfigError(
            f"trace_steps: cell {traced.id} traces {steps_of(traced.spec)} steps, but traces are reduced only from"
            f" the profiler of PyTorch {'.'.join(map(str, MIN_TORCH))} or later (operator categories, shapes,"
            f" Gloo's collectives as spans) and this host has PyTorch {version}: upgrade it, or set trace_steps: 0"
        )
