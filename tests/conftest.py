"""Fixtures every stage's tests share. Layout: tests/unit/<stage>/ holds the fast tests of one
subpackage of dpstudy (a few marked slow start real processes), tests/e2e/ the runs of the whole
workflow, a real SLURM, the report in Chromium and the GPU paths; tests/helpers/ what they import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def synthetic_root(tmp_path_factory) -> Path:
    """A data root holding the generated `synthetic` dataset, prepared small (512 train, 128 test
    images): enough for a cell of one or two epochs. Tests only read it."""
    from dpstudy.data import store

    root = tmp_path_factory.mktemp("data")
    store.prepare("synthetic", root, {"train_size": 512, "test_size": 128})
    return root


@pytest.fixture(scope="session")
def python3_kernel() -> None:
    """The kernel papermill runs the report in; `make setup` installs it, a bare venv may lack it."""
    from jupyter_client.kernelspec import KernelSpecManager

    if "python3" not in KernelSpecManager().find_kernel_specs():
        subprocess.run(
            [sys.executable, "-m", "ipykernel", "install", "--sys-prefix", "--name", "python3"],
            check=True,
            capture_output=True,
        )


@pytest.fixture(scope="session")
def ext_test_dir() -> Path:
    """The extension, built once for the session into results/ext-test: CPU-only unless a GPU
    can run the CUDA kernels. Every test that loads the library shares it (the operator tests,
    the kernel benchmark, a lenet_ext job through DPSTUDY_EXT_DIR); it persists, so a later
    session reuses it and ninja recompiles only changed sources."""
    import torch
    from helpers import REPO

    import dpstudy.ext

    folder = REPO / "results" / "ext-test"
    dpstudy.ext.build(folder, cpu_only=not torch.cuda.is_available())
    return folder
