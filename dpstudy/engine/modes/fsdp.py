"""mode fsdp: FSDP2's `fully_shard` as torchtitan applies it, to each block (`shard_units`), then
to the root, over an explicit one-dimensional device mesh of the world. `shard` full re-gathers a
block's parameters for backward (ZeRO-3), grad_op keeps them from forward (ZeRO-2). bf16 and fp16
run through FSDP's MixedPrecisionPolicy (parameters cast for compute, gradients reduced in fp32)
instead of autocast; BatchNorm then stays in fp32 as a unit of its own."""

from __future__ import annotations

import contextlib
import itertools
import math
from typing import ClassVar

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from dpstudy.engine import probe
from dpstudy.engine.compiling import COMPILE_OPTIONS
from dpstudy.engine.modes.distributed import ProcessGroupMode

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


class FullyShardedDataParallel(ProcessGroupMode):
    name: ClassVar[str] = "fsdp"
    mesh: object = None  # the world's device mesh, made once

    def prepare(self, model: nn.Module, amp_dtype: torch.dtype | None, compiled: bool) -> nn.Module:
        """Each unit swapped for its compiled module before `fully_shard`, as torchtitan's
        apply_compile does: FSDP2's hooks (all-gather, reshard) then sit on the compiled wrapper and
        run eagerly at the unit's boundaries, so communication and its overlap stay FSDP2's, and the
        repeated blocks of one class share their code. Not nn.Module.compile, as the other modes:
        compiled in place, a unit's hooks run inside the compiled call, whose graph breaks at them,
        and torch's own layers (Conv2d, Linear) were then not compiled at all (0 graphs for LeNet)."""
        if compiled:
            parents = {
                id(child): (parent, name) for parent in model.modules() for name, child in parent.named_children()
            }
            units = shard_units(model)
            # Dynamo keeps a limited number of graphs per code object, and the units of one class
            # share their forward's code (LeNet's three Linear layers, ResNet's eight blocks), each
            # with its own shapes, for a full and a smaller last batch (evaluation runs eagerly):
            # room for them all, or the units past the limit would silently run uncompiled.
            config = torch._dynamo.config
            config.cache_size_limit = max(config.cache_size_limit, 4 * len(units))
            for unit in units:
                parent, name = parents[id(unit)]
                parent.register_module(name, torch.compile(unit, **COMPILE_OPTIONS))  # shard_units finds it
        return self.wrap(model, amp_dtype)

    def wrap(self, model: nn.Module, amp_dtype: torch.dtype | None) -> nn.Module:
        """`amp_dtype` (bf16, fp16) is the parameters' dtype for compute under the policy."""
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = self.device_mesh()
        policy = MixedPrecisionPolicy(
            param_dtype=amp_dtype, reduce_dtype=torch.float32 if amp_dtype is not None else None
        )
        reshard = self.sharding == "full"
        if amp_dtype is not None:
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

    def autocast(self, amp_dtype: torch.dtype | None):
        return contextlib.nullcontext()  # the policy casts (see wrap)

    def device_mesh(self):
        """The world's one-dimensional device mesh, made once (a memory prediction makes it before
        it enters FakeTensorMode, where a mesh cannot be made)."""
        from torch.distributed.device_mesh import init_device_mesh

        if self.mesh is None:
            self.mesh = init_device_mesh(self.device.type, (self.world_size,))
        return self.mesh

    def missing_forwards(self, batches: int) -> int:
        """Each FSDP forward all-gathers, a collective every rank must join, while the test set's
        disjoint shards can differ by a batch. Asked before the first forward, as the question is
        a collective too."""
        if not self.initialized:
            return 0
        most = torch.tensor([batches], dtype=torch.int64, device=self.comm_device())
        dist.all_reduce(most, op=dist.ReduceOp.MAX)
        return int(most) - batches

    def probe(self, trainer, steps: int) -> dict | None:
        """A step's forward and backward as FSDP runs it and the same step on an unsharded replica
        of the model (no collective at all: its compute), taking turns (probe.interleaved), and its
        collectives alone: one all-gather of every unit's parameters, and the reduce-scatter of
        every unit's gradients."""
        if self.world_size < 2:
            return None
        from torch.distributed.fsdp import FSDPModule

        model = trainer.model
        model.train()
        data = itertools.cycle(probe.batches(trainer, steps))
        # The compute of the same step without FSDP: a replica of the architecture built as the
        # cell's model was (weights do not change its time), cast as FSDP's policy casts (autocast
        # stands in for the bf16/fp16 copies). No forward of the measured model is needed for it.
        replica = trainer.build_replica()
        amp = trainer.amp_dtype

        def step(net: nn.Module, cast):
            def work():
                x, y = next(data)
                with cast():
                    loss = F.cross_entropy(net(x).float(), y)
                loss.backward()
                net.zero_grad(set_to_none=True)

            return work

        units = [m for m in model.modules() if isinstance(m, FSDPModule)]
        # each unit's parameters, not its sub-units' (a root that holds none gathers nothing)
        sizes = [n for n in (own_numel(unit) for unit in units) if n > 0]
        world = self.world_size
        gather_size = torch.finfo(amp).bits // 8 if amp is not None else 4
        buffers = [
            (
                torch.zeros(math.ceil(n / world) * world, device=self.device),
                torch.empty(math.ceil(n / world), device=self.device),
            )
            for n in sizes
        ]

        def all_gather():
            for unit in units:
                unit.unshard()
            for unit in units:
                unit.reshard()

        def reduce_scatter():
            for full, shard in buffers:
                dist.reduce_scatter_tensor(shard, full)

        sharded = step(model, contextlib.nullcontext)
        compute = step(
            replica, lambda: torch.autocast(self.device.type, dtype=amp) if amp else contextlib.nullcontext()
        )
        warm_up_s = probe.timed_once(trainer, sharded)
        for work in (compute, all_gather, reduce_scatter):  # warm-up
            work()
        dist.barrier()
        steps = probe.affordable_steps(trainer, warm_up_s, steps)
        turns = probe.interleaved(trainer, sharded, compute, steps)
        times = [probe.per_step(trainer, work, steps) for work in (all_gather, reduce_scatter)]
        slowest = self.all_gather_floats(times)
        del replica
        return {
            "steps": steps,
            **turns,
            "allgather_s": max(slowest[0::2]),
            "reduce_scatter_s": max(slowest[1::2]),
            "gather_bytes": sum(sizes) * gather_size,
            "grad_bytes": sum(sizes) * 4,  # reduced in fp32 (the policy's reduce_dtype, or fp32 params)
            "units": len(sizes),
        }


def own_numel(unit: nn.Module) -> int:
    """Elements of the parameters FSDP manages in `unit` itself, those of nested units left out."""
    from torch.distributed.fsdp import FSDPModule

    nested = {id(p) for m in unit.modules() if m is not unit and isinstance(m, FSDPModule) for p in m.parameters()}
    return sum(p.numel() for p in unit.parameters() if id(p) not in nested)
