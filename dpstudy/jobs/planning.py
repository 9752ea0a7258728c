"""A study config -> what the workflow plans from it, before any job: the validated study, its
cells, the user's own datasets with the fingerprint of what preparing each reads, the check of the
user's models and data (dpstudy.jobs.usercheck), whether jobs reserve GPUs, the extension build's
arguments and the memory allocator. rules/common.smk calls `plan` once and turns its ConfigError
into Snakemake's "invalid study config"; the tests call it in process where Snakemake itself is not under test.
No torch and no pandas: the workflow plans in Snakemake's own process."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from dpstudy.data import user as user_data
from dpstudy.ext import arch as ext_arch
from dpstudy.jobs import usercheck
from dpstudy.jobs.gpus import visible_gpu_count
from dpstudy.study import outputs, sweeps
from dpstudy.study.resources import requests_gpus
from dpstudy.study.sweeps import Cell
from dpstudy.util import allocator


@dataclass
class Plan:
    study: dict[str, Any]
    cells: list[Cell]
    user_datasets: dict[str, user_data.UserDataset]  # the study's own datasets, by name
    fingerprints: dict[str, str]  # ... and what preparing each reads (new images: prepared anew)
    gpu_jobs: bool  # whether jobs reserve GPUs (config request_gpus; device auto on a CPU host: no)
    ext_build_args: list[str]  # scripts/build_ext.py's: the planned CUDA architectures, --require-cuda
    allocator: allocator.Setup  # what config allocator means on the planning host


def plan(
    config: dict[str, Any],
    config_files: Iterable[str] = (),
    user_check: str | None = outputs.USER_CHECK,
    visible_gpus: int | None = None,
    capabilities: Iterable[tuple[int, int]] | None = None,
) -> Plan:
    """The plan of `config`, or ConfigError naming the key, value or sweep at fault. `user_check`:
    where the verdict of the user-code check is remembered (None: no check); `visible_gpus` and
    `capabilities`: this host's, asked of NVML unless given."""
    study = sweeps.load(config, config_files)
    memory_allocator = allocator.resolve(study["allocator"])  # a library this host lacks: an error now
    cells = sweeps.expand(study)
    datasets = user_data.in_study(study, cells)
    fingerprints = {name: user_data.fingerprint(dataset) for name, dataset in datasets.items()}
    if user_check is not None:
        usercheck.check(study, cells, user_check, fingerprints)
    gpu_jobs = requests_gpus(study, visible_gpu_count() if visible_gpus is None else visible_gpus)
    visible = ext_arch.visible_capabilities() if capabilities is None else capabilities
    return Plan(
        study,
        cells,
        datasets,
        fingerprints,
        gpu_jobs,
        ext_arch.build_args(study["ext"]["cuda_arch"], gpu_jobs, visible),
        memory_allocator,
    )
