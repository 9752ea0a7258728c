"""The four modes behind one small interface: where the model lives and how ranks agree.

`plan()` decides, before any process group exists, whether this hardware can run the cell at
all; a cell it cannot run is skipped with the reason rather than faked.

fsdp applies FSDP2's `fully_shard` the way torchtitan does: to each block (`shard_units`), then
to the root, over an explicit one-dimensional device mesh of the world; `shard` full re-gathers a
block's parameters for backward (ZeRO-3), grad_op keeps them from forward (ZeRO-2). bf16 and fp16
run through FSDP's MixedPrecisionPolicy (parameters cast for compute, gradients reduced in fp32)
instead of autocast; BatchNorm then stays in fp32 as a unit of its own.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn

from dpstudy.engine.loaders import Shard
from dpstudy.study.spec import PROCESS_PER_DEVICE_MODES, hardware_gap
from dpstudy.util.ports import free_port


class Skip(Exception):
    """The hardware cannot run this cell; the message is the reason recorded."""


@dataclass
class Parallel:
    mode: str
    device: torch.device
    gpus: int
    backend: str = "none"
    sharding: str = "none"  # fsdp: full | grad_op
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    initialized: bool = field(default=False, repr=False)
    mesh: object = field(default=None, repr=False)  # fsdp: the world's device mesh, made once

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def shard(self) -> Shard:
        return Shard(self.rank, self.world_size)

    def devices(self) -> list[int]:
        """CUDA device indices this process drives (DP drives several)."""
        if self.device.type != "cuda":
            return []
        return list(range(self.gpus)) if self.mode == "dp" else [self.device.index or 0]

    @property
    def distributed(self) -> bool:
        """One process per device (ddp, fsdp), in a process group once started."""
        return self.mode in PROCESS_PER_DEVICE_MODES

    def start(self) -> None:
        if not self.distributed:
            return
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        # torchrun provides MASTER_ADDR/PORT, RANK and WORLD_SIZE; a bare single process does not.
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        kwargs = {"device_id": self.device} if self.backend == "nccl" else {}
        dist.init_process_group(self.backend, rank=self.rank, world_size=self.world_size, **kwargs)
        self.initialized = True

    def wrap(self, model: nn.Module, compute_dtype: torch.dtype | None = None) -> nn.Module:
        """The model as this mode trains it. `compute_dtype` (bf16, fp16) is FSDP's parameter dtype
        for compute; the other modes cast with autocast instead (Trainer.autocast)."""
        if self.mode == "dp":
            return nn.DataParallel(model, device_ids=self.devices())
        if self.mode == "ddp":
            ids = [self.device.index] if self.device.type == "cuda" else None
            return nn.parallel.DistributedDataParallel(model, device_ids=ids)
        if self.mode == "fsdp":
            return self.fully_shard(model, compute_dtype)
        return model

    def fully_shard(self, model: nn.Module, compute_dtype: torch.dtype | None) -> nn.Module:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = self.device_mesh()
        policy = MixedPrecisionPolicy(
            param_dtype=compute_dtype, reduce_dtype=torch.float32 if compute_dtype is not None else None
        )
        reshard = self.sharding == "full"
        if compute_dtype is not None:
            # BatchNorm keeps fp32 parameters beside its fp32 running statistics, as FSDP1's
            # MixedPrecision does by default (_module_classes_to_ignore): a unit of its own.
            for norm in model.modules():
                if isinstance(norm, nn.modules.batchnorm._BatchNorm):
                    fully_shard(norm, mesh=mesh, reshard_after_forward=reshard)
        for unit in shard_units(model):
            fully_shard(unit, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
        # The root keeps what no block holds (norm layers, a lone head); FSDP never reshards it
        # after forward, as backward needs it first.
        fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
        return model

    def device_mesh(self):
        """The world's one-dimensional device mesh, made once (a memory prediction makes it before
        it enters FakeTensorMode, where a mesh cannot be made)."""
        from torch.distributed.device_mesh import init_device_mesh

        if self.mesh is None:
            self.mesh = init_device_mesh(self.device.type, (self.world_size,))
        return self.mesh

    def missing_forwards(self, batches: int) -> int:
        """How many extra forward passes this rank must make, after its `batches`, to make as many
        as the busiest rank: each FSDP forward all-gathers, a collective every rank must join, while
        the test set's disjoint shards can differ by a batch. Asked before the first forward, as
        the question is a collective too."""
        if self.mode != "fsdp" or not self.initialized:
            return 0
        most = torch.tensor([batches], dtype=torch.int64, device=self.comm_device())
        dist.all_reduce(most, op=dist.ReduceOp.MAX)
        return int(most) - batches

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.initialized:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def all_gather_floats(self, values: list[float]) -> list[float]:
        """Every rank's list, concatenated in rank order."""
        if not self.initialized:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=self.comm_device())
        out = [torch.empty_like(t) for _ in range(self.world_size)]
        dist.all_gather(out, t)
        return [v for part in out for v in part.tolist()]

    def all_gather_objects(self, value) -> list:
        """Every rank's picklable `value`, in rank order."""
        if not self.initialized:
            return [value]
        out = [None] * self.world_size
        dist.all_gather_object(out, value)
        return out

    def sync_buffers(self, model: nn.Module) -> None:
        """Give every rank rank 0's BatchNorm statistics before evaluating."""
        if self.initialized:
            for buffer in model.buffers():
                dist.broadcast(buffer, src=0)

    def comm_device(self) -> torch.device:
        return self.device if self.backend == "nccl" else torch.device("cpu")

    def synchronize(self) -> None:
        for index in self.devices():
            torch.cuda.synchronize(index)

    def close(self) -> None:
        if self.initialized:
            destroy_process_group()
            self.initialized = False


# Normalisation layers hold a few parameters each: a unit of their own would cost an all-gather
# for almost nothing, so they stay with the root.
NORM_LAYERS = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm)


def shard_units(model: nn.Module) -> list[nn.Module]:
    """FSDP's units below the root: each element of a top-level Sequential or ModuleList (ResNet's
    blocks, ViT's blocks, a CNN's convolutions and linear layers), else the top-level child itself,
    where it holds parameters and is not a normalisation layer."""
    units = []
    for child in model.children():
        parts = list(child) if isinstance(child, (nn.Sequential, nn.ModuleList)) else [child]
        units += [m for m in parts if not isinstance(m, NORM_LAYERS) and any(True for _ in m.parameters())]
    return units


def destroy_process_group() -> None:
    """dist.destroy_process_group(), without the Gloo shutdown deadlock of torch < 2.8.

    Before 2.8 (pytorch/pytorch#154976) the process group's destructor joins Gloo's worker threads
    holding the GIL, while a worker may still be freeing the last collective's tensors, which takes
    the GIL. Holding the Gloo backend past destroy_process_group() leaves that join to the
    backend's own destructor, which releases the GIL.
    """
    backend = dist.group.WORLD._get_backend(torch.device("cpu")) if dist.get_backend() == "gloo" else None
    dist.destroy_process_group()
    del backend  # the join happens here, with the GIL released


def resolve_device(requested: str) -> str:
    """'auto' becomes cuda when a GPU is visible, else cpu."""
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return requested


def plan(spec: dict, env: dict[str, str] | None = None) -> Parallel:
    """The Parallel for this process, or Skip with the reason the hardware cannot run the cell."""
    env = os.environ if env is None else env
    mode, gpus, backend = spec["mode"], spec["gpus"], spec["backend"]
    device_type = resolve_device(spec["device"])
    gap = hardware_gap(spec, torch.cuda.device_count() if torch.cuda.is_available() else 0)
    if gap:
        raise Skip(gap)

    world = int(env.get("WORLD_SIZE", "1"))
    if mode not in PROCESS_PER_DEVICE_MODES:
        if world != 1:
            raise Skip(f"mode {mode} runs as one process, but was launched with world size {world}")
        return Parallel(mode, torch.device(device_type, 0) if device_type == "cuda" else torch.device("cpu"), gpus)
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
    device = torch.device("cuda", local_rank) if device_type == "cuda" else torch.device("cpu")
    return Parallel(
        mode,
        device,
        gpus,
        backend,
        sharding=spec.get("shard", "none"),
        rank=int(env.get("RANK", "0")),
        world_size=world,
        local_rank=local_rank,
        local_world_size=int(env.get("LOCAL_WORLD_SIZE", str(world))),
    )


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
