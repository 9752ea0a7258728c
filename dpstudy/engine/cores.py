"""Which CPU cores a rank's threads run on: each rank its own block, so cells measure steadily.

A CPU cell owns the machine (the workflow gives it every core), so rank r takes the r-th block of
the cores it may use. GPU cells share the host: a rank driving GPU g takes a block inside g's share
of the host's cores (its cores / its GPUs), so that cells on different GPUs never share a core. A
CUDA rank's Python thread is what launches the kernels: left free to migrate among all the cores, a
small model's step rate varied about twice as much as pinned to one core, and ran slower
(benchmarks/cuda_noise.py measures both; docs/report.md quotes them). What pinning leaves is the
host core's own speed, which moves a fixed pure-Python loop as much, while the same step as one
CUDA graph (no launches) does not move.
"""

from __future__ import annotations

import os

# "0" turns the pinning off (benchmarks/noise_floor.py; the tests, whose cells share the machine)
PIN_ENV = "DPSTUDY_PIN_CORES"


def core_block(
    allowed: list[int], local_rank: int, threads: int, gpu: int | None = None, host_gpus: int = 0
) -> list[int]:
    """The cores of the rank's block among `allowed` (sorted): GPU `gpu`'s share of the host where
    the host has `host_gpus` GPUs and each share holds `threads` cores, else the local_rank-th block
    of `threads`. Empty where too few cores are left for the block (nothing pinned then)."""
    share = len(allowed) // host_gpus if host_gpus > 0 else 0
    if gpu is not None and 0 <= gpu < host_gpus and share >= threads:
        start = gpu * share
    else:
        start = local_rank * threads
    cores = allowed[start : start + threads]
    return cores if len(cores) == threads else []


def pin_to_cores(local_rank: int, threads: int, gpu: int | None = None, host_gpus: int = 0) -> list[int]:
    """Pin this process to its block of the cores it may use (a scheduler's cgroup or taskset
    included; see core_block). Returns the cores; nothing is pinned (empty list) when there are
    fewer cores than the ranks need, or DPSTUDY_PIN_CORES=0 (benchmarks/noise_floor.py)."""
    cores = core_block(sorted(os.sched_getaffinity(0)), local_rank, threads, gpu, host_gpus)
    if not cores or os.environ.get(PIN_ENV) == "0":
        return []
    os.sched_setaffinity(0, cores)
    return cores


def visible_gpu(local_rank: int) -> int | None:
    """The host's number of the GPU this rank drives (CUDA_VISIBLE_DEVICES' entry for it; the
    first where it lists fewer), None where it is unset or names GPUs by UUID."""
    entries = [e.strip() for e in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if e.strip()]
    if not entries:
        return None
    entry = entries[local_rank] if local_rank < len(entries) else entries[0]
    return int(entry) if entry.isdigit() else None


def pin_gpu_rank(local_rank: int, threads: int) -> list[int]:
    """pin_to_cores for a rank that drives a GPU: its block inside that GPU's share of the host."""
    from dpstudy.util import nvml  # only a GPU rank opens NVML

    return pin_to_cores(local_rank, threads, visible_gpu(local_rank), nvml.gpu_count())


def threads_per_process(total_cores: int, local_world_size: int) -> int:
    """Processes of one job share its cores instead of each taking them all."""
    return max(1, total_cores // local_world_size)
