"""The modes a cell trains in, one class each (see base.Mode), and `mode_for`, which picks the class
and decides, before any process group exists, whether this hardware can run the cell at all: a
cell it cannot run is skipped with the reason rather than faked."""

from __future__ import annotations

import os

import torch

from dpstudy.engine.checkpointing import how_of
from dpstudy.engine.modes.base import Mode, Single
from dpstudy.engine.modes.ddp import DistributedDataParallel
from dpstudy.engine.modes.deepspeed import DeepSpeed
from dpstudy.engine.modes.dp import DataParallel
from dpstudy.engine.modes.fsdp import FullyShardedDataParallel
from dpstudy.study import modes
from dpstudy.study.spec import hardware_gap

# The engine's class of each mode of the modes' table (dpstudy.study.modes, the facts of every mode):
# a new mode is a row there, a class and its entry here; docs/extending.md lists the rest.
MODES: dict[str, type[Mode]] = {
    cls.name: cls for cls in (Single, DataParallel, DistributedDataParallel, FullyShardedDataParallel, DeepSpeed)
}
assert set(MODES) == set(modes.TABLE)
assert all(MODES[m].distributed == modes.TABLE[m].per_device for m in MODES)

__all__ = ["MODES", "Mode", "Skip", "mode_for", "resolve_device"]


class Skip(Exception):
    """The hardware cannot run this cell; the message is the reason recorded."""


def resolve_device(requested: str) -> str:
    """'auto' becomes cuda when a GPU is visible, else cpu."""
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return requested


def mode_for(spec: dict, env: dict[str, str] | None = None) -> Mode:
    """The mode of this process, or Skip with the reason the hardware cannot run the cell."""
    env = os.environ if env is None else env
    cls, gpus, backend = MODES[spec["mode"]], spec["gpus"], spec["backend"]
    device_type = resolve_device(spec["device"])
    gap = hardware_gap(spec, torch.cuda.device_count() if torch.cuda.is_available() else 0)
    if gap:
        raise Skip(gap)

    world = int(env.get("WORLD_SIZE", "1"))
    checkpointing = how_of(spec)  # activation_checkpointing, applied by every mode
    if not cls.distributed:
        if world != 1:
            raise Skip(f"mode {cls.name} runs as one process, but was launched with world size {world}")
        device = torch.device(device_type, 0) if device_type == "cuda" else torch.device("cpu")
        return cls(device, gpus, checkpointing=checkpointing)
    nodes, launched_nodes = spec.get("nodes", 1), int(env.get("GROUP_WORLD_SIZE", "1"))
    if nodes != launched_nodes:
        raise Skip(
            f"nodes {nodes} needs a launch on {nodes} nodes (srun torchrun --nnodes={nodes}, as the "
            f"cluster profiles do: snakemake --profile profiles/slurm); it was launched on {launched_nodes}"
        )
    if world != nodes * gpus:
        raise Skip(
            f"world size {world} does not match nodes x gpus {nodes * gpus} "
            f"(launch with torchrun --nnodes={nodes} --nproc-per-node={gpus})"
        )
    local_rank = int(env.get("LOCAL_RANK", "0"))
    return cls(
        torch.device("cuda", local_rank) if device_type == "cuda" else torch.device("cpu"),
        gpus,
        backend,
        shard=spec.get("shard", "none"),
        rank=int(env.get("RANK", "0")),
        world_size=world,
        local_rank=local_rank,
        local_world_size=int(env.get("LOCAL_WORLD_SIZE", str(world))),
        options=cls.options_of(spec),
        checkpointing=checkpointing,
    )
