"""What a job asks Snakemake or a cluster scheduler for, computed from its cell.

The names are Snakemake's standard resources (mem_mb, runtime, cpus_per_task, nodes, tasks,
mpi) and those snakemake-executor-plugin-slurm and the cluster-generic submit template read
(gpu, gres, cpus_per_gpu), so one table serves the local run and every cluster profile. Values
are per node where the scheduler counts per node (mem_mb, cpus_per_task, gres), and a None
leaves a resource unset (Snakemake drops it).
"""

from __future__ import annotations

import math
from typing import Any

from dpstudy.study.spec import one_process_per_device
from dpstudy.util.errors import ConfigError


def requests_gpus(study: dict[str, Any], visible_gpus: int) -> bool:
    """Whether the study's jobs reserve GPUs (config `request_gpus`, see dpstudy/study/schema.yaml)."""
    device, request = study["device"], study["request_gpus"]
    if device == "cuda" and request == "never":
        raise ConfigError("config: device 'cuda' needs GPUs, but request_gpus is 'never'")
    if device == "cpu" or request == "never":
        return False
    return request == "always" or device == "cuda" or visible_gpus > 0


def comm_bench_gpus(gpu_jobs: bool, visible_gpus: int, wanted: int = 2) -> int:
    """GPUs the all-reduce microbenchmark reserves: `wanted`, but no more than this host shows
    (on a 1-GPU host it measures what one GPU can); all of them where the planning host sees none
    (a cluster's login node); none in a study that reserves no GPU."""
    if not gpu_jobs:
        return 0
    return min(wanted, visible_gpus) if visible_gpus else wanted


def plan_gpus(gpu_jobs: bool, visible_gpus: int, gpu_budget: int | None) -> int:
    """GPUs the memory plan reserves: one where jobs reserve GPUs and this host shows one within
    --resources gpu, for the libraries' workspaces (dpstudy.workflow.workspaces), which it measures on that
    GPU: reserved, so that it never runs beside a timed cell on the same GPU. 0 elsewhere (a
    login node, a CPU study): the plan then leaves the workspaces out and says so."""
    return int(gpu_jobs and visible_gpus > 0 and (gpu_budget is None or gpu_budget >= 1))


def comm_world_sizes(specs: list[dict[str, Any]], predicted_gpus: list[int], capacity: int | None) -> list[int]:
    """The world sizes comm_bench measures: 2, and every larger one that the study's DDP and FSDP
    cells run on one node or its forecast: block asks for, up to `capacity`, the ranks this host
    can hold (the GPUs it shows, or its cores for a CPU study; None where the planning host cannot
    tell, a cluster's login node). A forecast at a size measured here reads its own fit; beyond
    them, the largest measured is extrapolated (dpstudy.analysis.step_model.collective_time)."""
    wanted = {processes_per_node(s) for s in specs if s["nodes"] == 1} | set(predicted_gpus)  # DP: one process
    return sorted({2} | {n for n in wanted if n > 2 and (capacity is None or n <= capacity)})


def rank_capacity(gpu_jobs: bool, visible_gpus: int, gpu_budget: int | None, cores: int) -> int | None:
    """How many ranks of one job this host holds: its cores in a study that reserves no GPU, else
    the GPUs it shows within --resources gpu; None where neither is known (a login node)."""
    if not gpu_jobs:
        return cores
    known = [n for n in (visible_gpus or None, gpu_budget) if n is not None]
    return min(known) if known else None


def cell_cores(spec: dict[str, Any]) -> int:
    """Cores per node: one per device (process on CPU) and one per DataLoader worker."""
    return spec["gpus"] * (1 + spec["workers"])


def processes_per_node(spec: dict[str, Any]) -> int:
    return spec["gpus"] if one_process_per_device(spec) else 1


def train_resources(spec: dict[str, Any], job: dict[str, Any], gpus: bool) -> dict[str, Any]:
    """Resources of one cell's train job. `job` is the cell's job_resources (dpstudy/study/schema.yaml),
    `gpus` whether the study reserves GPUs.

    One node: gpu=G (Snakemake's --resources and the plugin's --gpus), cores per GPU or per task.
    Several nodes: one task per node (`mpi`: the job's own command starts them with srun), GPUs
    per node as gres; tasks_per_gpu 0 keeps the plugin from reading `tasks` as tasks per GPU.
    """
    nodes, cores = spec["nodes"], cell_cores(spec)
    several = nodes > 1
    return {
        "gpu": None if several else spec["gpus"] if gpus else 0,
        "gres": f"gpu:{spec['gpus']}" if gpus and several else None,
        "cpus_per_task": None if gpus and not several else cores,
        "cpus_per_gpu": 1 + spec["workers"] if gpus and not several else None,
        "mem_mb": processes_per_node(spec) * job["mem_mb_per_process"] + job["mem_mb_per_job"],
        "runtime": math.ceil(job["runtime_min"]),  # schedulers take whole minutes
        "limit_s": round(60 * job["runtime_min"]),  # the launcher's own limit (dpstudy.jobs.timelimit)
        # how long a collective waits for a silent peer (init_process_group), within the limit
        "collective_timeout_s": max(1, round(60 * min(job["collective_timeout_min"], job["runtime_min"] / 2))),
        "nodes": nodes,
        "tasks": nodes if several or not gpus else None,
        "tasks_per_gpu": 0 if gpus and several else None,
        "mpi": "srun" if several else None,
        # Ours, not the scheduler's: what the launcher and the engine are told they have per node.
        "node_gpus": spec["gpus"] if gpus else 0,
        "node_cores": cores,
    }
