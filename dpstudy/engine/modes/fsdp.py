"""mode fsdp: FSDP2's `fully_shard` as torchtitan applies it, to each block (`shard_units`), then
to the root, over an explicit device mesh. `shard` full re-gathers a block's parameters for
backward (ZeRO-3), grad_op keeps them from forward (ZeRO-2), both over a one-dimensional mesh of
the world. hybrid (HSDP) is full over a two-dimensional mesh (replicate x shard): the world is
`replicate` replicas of world / replicate ranks each (the ranks of one node by default, so that the
all-gathers stay inside a node); each replica shards the model over its own ranks as full does,
and the replicas all-reduce the gradient shards. bf16 and fp16 run through FSDP's
MixedPrecisionPolicy (parameters cast for compute, gradients reduced in fp32) instead of autocast;
BatchNorm then stays in fp32 as a unit of its own."""

from __future__ import annotations

import contextlib
from typing import ClassVar

import torch
import torch.distributed as dist
import torch.nn as nn

from dpstudy.engine.blocks import blocks, parents
from dpstudy.engine.compiling import COMPILE_OPTIONS
from dpstudy.engine.modes.distributed import ProcessGroupMode
from dpstudy.study.spec import replicas

# The two dimensions of hybrid's mesh, named as FSDP2 reads them: replicate (dim 0), shard (dim 1).
MESH_DIMS = ("replicate", "shard")


def shard_units(model: nn.Module) -> list[nn.Module]:
    """FSDP's units below the root: the model's blocks (dpstudy.engine.blocks), the same modules
    activation checkpointing wraps (once wrapped, the wrappers)."""
    return blocks(model)


class FullyShardedDataParallel(ProcessGroupMode):
    name: ClassVar[str] = "fsdp"
    mesh: object = None  # the device mesh, made once

    @classmethod
    def options_of(cls, spec: dict) -> dict:
        """hybrid's replicate degree (spec.replicas: the setting, or the nodes); none otherwise."""
        return {"replicate": replicas(spec)} if spec.get("shard") == "hybrid" else {}

    def prepare(self, model: nn.Module, amp_dtype: torch.dtype | None, compiled: bool) -> nn.Module:
        """Each unit swapped for its compiled module before `fully_shard`, as torchtitan's
        apply_compile does: FSDP2's hooks (all-gather, reshard) then sit on the compiled wrapper and
        run eagerly at the unit's boundaries, so communication and its overlap stay FSDP2's, and the
        repeated blocks of one class share their code. Not nn.Module.compile, as the other modes:
        compiled in place, a unit's hooks run inside the compiled call, whose graph breaks at them,
        and torch's own layers (Conv2d, Linear) were then not compiled at all (0 graphs for LeNet).
        Activation checkpointing comes first: the units compiled and sharded are its wrappers."""
        model = self.checkpointed(model)
        if compiled:
            where = parents(model)
            units = shard_units(model)
            # Dynamo keeps a limited number of graphs per code object, and the units of one class
            # share their forward's code (LeNet's three Linear layers, ResNet's eight blocks), each
            # with its own shapes, for a full and a smaller last batch (evaluation runs eagerly):
            # room for them all, or the units past the limit would silently run uncompiled.
            config = torch._dynamo.config
            config.cache_size_limit = max(config.cache_size_limit, 4 * len(units))
            for unit in units:
                parent, name = where[id(unit)]
                parent.register_module(name, torch.compile(unit, **COMPILE_OPTIONS))  # shard_units finds it
        return self.wrap(model, amp_dtype)

    def wrap(self, model: nn.Module, amp_dtype: torch.dtype | None) -> nn.Module:
        """`amp_dtype` (bf16, fp16) is the parameters' dtype for compute under the policy."""
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = self.device_mesh()
        policy = MixedPrecisionPolicy(
            param_dtype=amp_dtype, reduce_dtype=torch.float32 if amp_dtype is not None else None
        )
        reshard = self.shard in ("full", "hybrid")  # hybrid: full inside each replica
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
        """The device mesh, made once (a memory prediction makes it before it enters
        FakeTensorMode, where a mesh cannot be made): the world's, one-dimensional; under hybrid
        (replicate, world / replicate), whose rows (consecutive ranks: a node's) each hold one
        replica sharded over them."""
        from torch.distributed.device_mesh import init_device_mesh

        if self.mesh is None:
            if self.shard == "hybrid":
                replicate = self.options["replicate"]
                shape = (replicate, self.world_size // replicate)
                self.mesh = init_device_mesh(self.device.type, shape, mesh_dim_names=MESH_DIMS)
            else:
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
