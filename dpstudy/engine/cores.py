"""Which CPU cores a rank's threads run on: each rank its own block, so CPU cells measure steadily."""

from __future__ import annotations

import os


def pin_to_cores(local_rank: int, threads: int) -> list[int]:
    """Pin this process to its own `threads` cores of those it may use (a scheduler's cgroup or
    taskset included): rank r takes the r-th block. A thread that migrates between cores, or two
    ranks that share one, make a CPU cell's throughput vary from run to run. Returns the cores;
    nothing is pinned (empty list) when there are fewer cores than the ranks need."""
    allowed = sorted(os.sched_getaffinity(0))
    cores = allowed[local_rank * threads : (local_rank + 1) * threads]
    if len(cores) < threads or os.environ.get("DPSTUDY_PIN_CORES") == "0":  # 0: benchmarks/noise_floor.py
        return []
    os.sched_setaffinity(0, cores)
    return cores


def threads_per_process(total_cores: int, local_world_size: int) -> int:
    """Processes of one job share its cores instead of each taking them all."""
    return max(1, total_cores // local_world_size)
