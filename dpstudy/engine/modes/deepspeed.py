"""mode deepspeed: DeepSpeed's ZeRO through `deepspeed.initialize`, stage 1, 2 or 3 as the cell's
shard (zero1, zero2, zero3), on the process group every process-group mode starts (Gloo on a CPU,
DeepSpeed's CPU accelerator; NCCL on GPUs), under the same torchrun launcher as DDP.

The engine owns the optimizer, the backward and the step: it takes the cell's own optimizer (the
study's, dpstudy.engine.optimizers) and wraps it in its ZeRO optimizer, which keeps an fp32 master
copy of this rank's partition. ZeRO-1 partitions the optimizer state, ZeRO-2 the gradients too,
ZeRO-3 the parameters too (gathered per module for forward and backward). bf16 and fp16 run
through DeepSpeed's own config: it casts the module, so floating inputs are cast to its dtype on
the way in. The config pins what would otherwise make ZeRO train another model than the other
modes: no gradient clipping (DeepSpeed clips at 1.0 unless told), one step per batch; the rest is
DeepSpeed's default unless the study sets its knobs (dpstudy.study.modes).

Throughput is the Trainer's own end-to-end timing, as for every mode; DeepSpeed's timers are off.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from typing import ClassVar

import torch
import torch.distributed as dist
import torch.nn as nn

from dpstudy.engine import optimizers
from dpstudy.engine.modes.distributed import ProcessGroupMode
from dpstudy.study import modes
from dpstudy.study import spec as specs

STAGES = {"zero1": 1, "zero2": 2, "zero3": 3}


def imported(device_type: str):
    """deepspeed, imported for this device (DS_ACCELERATOR: cpu or cuda) and made quiet and
    compile-free: its communication backend builds a C++ shared-memory all-reduce with ninja on
    every start (44 s the first time on a CPU, and a failed start without a compiler) that only its
    inference path uses; the cell never calls it, so the build is skipped."""
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if device_type == "cuda" else "cpu")
    import deepspeed

    backend = sys.modules.get("deepspeed.comm.torch")
    if backend is not None and hasattr(backend, "build_shm_op"):
        backend.build_shm_op = lambda: None
    # "untested optimizer" for SGD, which ZeRO runs as it runs Adam: not the user's news
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    # torch deprecates the names DeepSpeed calls, once a call under ZeRO-3: every step of every rank
    warnings.filterwarnings(
        "ignore", message=r".*(all_gather_into_tensor|reduce_scatter_tensor)", category=FutureWarning
    )
    return deepspeed


def cast_inputs(dtype: torch.dtype):
    """A forward pre-hook that casts floating inputs to the module's dtype (DeepSpeed's bf16 casts
    the module, not its inputs: images arrive in fp32; token ids stay integers)."""

    def hook(module: nn.Module, args: tuple):
        return tuple(a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)

    return hook


def inner(optimizer):
    """The torch optimizer a ZeRO optimizer steps on its fp32 partition."""
    return getattr(optimizer, "optimizer", optimizer)


def tensors_of(value, depth: int = 0, seen: set | None = None):
    """Every tensor reachable from `value` through lists, tuples, dicts and DeepSpeed's own objects."""
    seen = set() if seen is None else seen
    if isinstance(value, torch.Tensor):
        yield value
        return
    if depth > 4 or id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, dict):
        children = value.values()
    elif isinstance(value, list | tuple):
        children = value
    elif type(value).__module__.startswith("deepspeed") and hasattr(value, "__dict__"):
        children = vars(value).values()
    else:
        return
    for child in children:
        yield from tensors_of(child, depth + 1, seen)


def zero_state(engine, optimizer) -> dict[str, list[torch.Tensor]]:
    """The tensors a ZeRO optimizer holds, one per storage, by what they are: PARAM (the module's
    parameters, or under ZeRO-3 this rank's shards of them), OPT (the inner optimizer's state and
    the fp32 master copy of this rank's partition, as the ZeRO paper counts them) and GRAD
    (everything else: gradient partitions and buckets)."""
    params = {p for p in engine.module.parameters()}
    storages = lambda tensors: {t.untyped_storage().data_ptr() for t in tensors}  # noqa: E731
    param_ptrs = storages([*params, *(p.ds_tensor for p in params if hasattr(p, "ds_tensor"))])
    state = [t for s in inner(optimizer).state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    opt_ptrs = storages(state)
    found: dict[str, list[torch.Tensor]] = {"PARAM": [], "OPT": [], "GRAD": []}
    seen: set[int] = set()
    for name, value in vars(optimizer).items():
        for tensor in tensors_of(value):
            ptr = tensor.untyped_storage().data_ptr()
            if ptr == 0 or ptr in seen:
                continue
            seen.add(ptr)
            kind = "PARAM" if ptr in param_ptrs else "OPT" if ptr in opt_ptrs or "fp32" in name else "GRAD"
            found[kind].append(tensor)
    return found


class DeepSpeed(ProcessGroupMode):
    name: ClassVar[str] = "deepspeed"
    engine: object = None  # the DeepSpeedEngine, made with the optimizer

    @classmethod
    def options_of(cls, spec: dict) -> dict:
        """The DeepSpeed knobs the study sets (a null one keeps DeepSpeed's default)."""
        scheme = modes.scheme(cls.name, spec.get("shard"))
        own = (*modes.TABLE[cls.name].knobs, *scheme.knobs)
        return {key: spec[key] for key in own if spec.get(key) is not None}

    def config(self, spec: dict, amp_dtype: torch.dtype | None) -> dict:
        zero = {"stage": STAGES[self.shard], **{k: int(v) for k, v in self.options.items()}}
        return {
            "train_micro_batch_size_per_gpu": specs.per_device_batch(spec),
            "gradient_accumulation_steps": 1,
            "gradient_clipping": 0.0,  # as every other mode: none
            "zero_allow_untested_optimizer": True,  # SGD
            "zero_optimization": zero,
            "bf16": {"enabled": amp_dtype == torch.bfloat16},
            "fp16": {"enabled": amp_dtype == torch.float16},
            "steps_per_print": 2**31 - 1,
            "wall_clock_breakdown": False,
        }

    def prepare(self, model: nn.Module, amp_dtype: torch.dtype | None, compiled: bool) -> nn.Module:
        """Activation checkpointing first, as in every mode; DeepSpeed wraps the model with its
        optimizer (see optimizer). compile: true is refused before any job (the modes' table)."""
        model = self.checkpointed(model)
        if amp_dtype is not None:
            model.register_forward_pre_hook(cast_inputs(amp_dtype))
        return model

    def optimizer(self, model: nn.Module, spec: dict, amp_dtype: torch.dtype | None):
        deepspeed = imported(self.device.type)
        client = optimizers.build(model.parameters(), spec)
        self.engine, optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=client, config=self.config(spec, amp_dtype), dist_init_required=False
        )
        return self.engine, optimizer

    def zero_grad(self, optimizer) -> None:
        self.engine.zero_grad()

    def backward(self, loss: torch.Tensor, scaler) -> None:
        self.engine.backward(loss)  # its own loss scaling under fp16

    def optimizer_step(self, optimizer, scaler) -> None:
        self.engine.step()

    def autocast(self, amp_dtype: torch.dtype | None):
        return contextlib.nullcontext()  # the engine casts the module (see prepare)

    def tracker(self, model: nn.Module, optimizer):
        """PyTorch's memory tracker following the module, the inner optimizer's state and what ZeRO's
        optimizer holds beside them (zero_state), each as what it is: the tracker sees tensors made
        before the step only where it is told of them."""
        from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType

        tracker = MemTracker()
        tracker.track_external(self.engine.module, inner(optimizer))
        for kind, tensors in zero_state(self.engine, optimizer).items():
            for tensor in tensors:
                tracker._update_and_maybe_create_winfos(tensor, getattr(_MemRefType, kind))
        return tracker

    def eval_model(self, model: nn.Module) -> nn.Module:
        return model.module  # ZeRO-3's gathering hooks sit on the module itself

    def missing_forwards(self, batches: int) -> int:
        """Under ZeRO-3 a forward gathers the parameters, a collective every rank must join, while
        the test set's disjoint shards can differ by a batch (as FSDP's)."""
        if not self.initialized or STAGES[self.shard] < 3:
            return 0
        most = torch.tensor([batches], dtype=torch.int64, device=self.comm_device())
        dist.all_reduce(most, op=dist.ReduceOp.MAX)
        return int(most) - batches
