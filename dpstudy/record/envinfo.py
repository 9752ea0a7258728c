"""The environment a record was measured in (docs/design.md, record.json: `env`), built here only.

`environment` is a rank's, measured with torch; `fallback_environment` is the env of a record no
rank measured (the launcher's failed and skipped records), built from the job's facts alone.
torch is imported where it is needed: the launcher reads the job's facts without paying for it.
"""

from __future__ import annotations

import os
import platform
import socket
import sys
from functools import cache
from pathlib import Path

from dpstudy.record.provenance import code_version
from dpstudy.util import allocator, nvml


@cache
def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_names() -> list[str]:
    import torch

    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def driver_version() -> str | None:
    return nvml.query(lambda n: n.nvmlSystemGetDriverVersion(), None)  # no NVIDIA driver: nothing to report


def nccl_version() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return None
    try:
        return ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:
        return None


def _torch_package() -> Path | None:
    """The folder of the torch package this Python imports, found without importing it."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    return Path(spec.origin).parent if spec is not None and spec.origin else None


def torch_version() -> str | None:
    """torch.__version__ (with its local label, e.g. +cu130) read from its file: without importing torch."""
    import re

    package = _torch_package()
    try:
        text = (package / "version.py").read_text() if package else ""
    except OSError:
        return None
    match = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
    return match.group(1) if match else None


# The file `make setup` leaves in the venv it made (scripts/dpstudy_setup/venv.py, STATE_FILE).
SETUP_STATE_FILE = "dpstudy-setup.json"


def torch_origin(prefix: str | None = None) -> dict:
    """Where torch comes from: {"torch_path": the folder that holds it, "torch_provider": "venv" when
    dpstudy's own venv (`make setup`) installed it, "host" when anything else provided it (make setup
    TORCH=system, a cluster module, a container's Python or its own venv, such as a GPU image's
    /opt/torch/.venv)}. `prefix` is the running environment's (sys.prefix by default)."""
    package = _torch_package()
    if package is None:
        return {"torch_path": None, "torch_provider": None}
    root = Path(prefix or sys.prefix).resolve()
    ours = (root / SETUP_STATE_FILE).is_file() and package.resolve().is_relative_to(root)
    return {"torch_path": str(package.parent), "torch_provider": "venv" if ours else "host"}


def rank_host(rank: int, local_rank: int) -> dict:
    """Where one rank runs (SLURM's node name when a SLURM step started it, else the hostname) and
    the memory allocator mapped into it."""
    hostname = socket.gethostname()
    return {
        "rank": rank,
        "local_rank": local_rank,
        "hostname": hostname,
        "node": os.environ.get("SLURMD_NODENAME", hostname),
        "allocator": allocator.in_this_process(),
    }


# What the launcher tells every process of the cell about how it was planned (dpstudy.workflow.estimates).
PACK_ENV, ESTIMATE_ENV = "DPSTUDY_PACK", "DPSTUDY_ESTIMATE_S"


def job_info() -> dict:
    """The scheduler's view of this job: SLURM's job id, the GPUs it was given, the pack it ran
    in and the cell's estimated wall time."""
    slurm_job = os.environ.get("SLURM_JOB_ID")
    estimate = os.environ.get(ESTIMATE_ENV)
    return {
        "scheduler": "slurm" if slurm_job else "local",
        "job_id": slurm_job,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "pack": os.environ.get(PACK_ENV) or None,
        "estimated_s": float(estimate) if estimate else None,
    }


def _job_facts(torch: str | None, world_size: int, nodes: int) -> dict:
    """What every record's env holds, whether a rank measured it or not."""
    return {
        "torch": torch,
        **torch_origin(),
        "python": platform.python_version(),
        "hostname": socket.gethostname(),
        "world_size": world_size,
        "nodes": nodes,
        "code_version": code_version(),
        "job": job_info(),
    }


def fallback_environment(world_size: int, nodes: int) -> dict:
    """The env of a record written without a rank's measurements (the launcher's failed or skipped
    record of a cell, or a rank's before it measured its own): the job's facts, without torch."""
    return _job_facts(torch_version(), world_size, nodes)


def environment(world_size: int, device: str, threads: int, nodes: int = 1) -> dict:
    """A rank's env: the job's facts and what torch says about this process's devices."""
    import torch

    return {
        **_job_facts(torch.__version__, world_size, nodes),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "nccl": nccl_version(),
        "cpu": cpu_name(),
        "cpu_count": len(os.sched_getaffinity(0)),
        "gpus": gpu_names(),
        "driver": driver_version(),
        "device": device,
        "threads_per_process": threads,
    }
