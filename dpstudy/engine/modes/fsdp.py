"""mode fsdp: FSDP2's `fully_shard` as torchtitan applies it, to each block (`shard_units`), then
to the root, over an explicit one-dimensional device mesh of the world. `shard` full re-gathers a
block's parameters for backward (ZeRO-3), grad_op keeps them from forward (ZeRO-2). bf16 and fp16
run through FSDP's MixedPrecisionPolicy (parameters cast for compute, gradients reduced in fp32)
instead of autocast; BatchNorm then stays in fp32 as a unit of its own."""

from __future__ import annotations

import contextlib
from typing import ClassVar

import torch
import torch.distributed as dist
import torch.nn as nn

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
        reshard = self.shard == "full"
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
