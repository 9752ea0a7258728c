"""What every mode shares, as mode `single` runs it: one process, one device, no collective.

A mode wraps the model and owns its collectives: what differs between the modes of the modes'
table (dpstudy.study.modes), so that the Trainer and the compile code hold no check of a mode's
name: where the model lives (`wrap`), whether torch.compile goes before or after wrapping
(`prepare`, each after activation checkpointing: dpstudy.engine.checkpointing), the optimizer, the
backward and the optimizer's step (a ZeRO engine owns all three: `optimizer`, `backward`,
`optimizer_step`), the autocast policy, the module evaluation runs on, and the collectives that
keep ranks in step. A mode knows nothing of the Trainer; the probe that times its collectives after
training is dpstudy.engine.probe's, chosen by the mode's name. A new mode is a subclass and an
entry in dpstudy.engine.modes.MODES.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import ClassVar

import torch
import torch.nn as nn

from dpstudy.engine import checkpointing, optimizers
from dpstudy.engine.compiling import COMPILE_OPTIONS
from dpstudy.engine.loaders import Partition


@dataclass
class Mode:
    name: ClassVar[str] = "single"
    # One process per device (torchrun), in a process group once started; else one process.
    distributed: ClassVar[bool] = False

    device: torch.device
    gpus: int = 1
    backend: str = "none"
    shard: str = "none"  # fsdp: full | grad_op | hybrid
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    options: dict = field(default_factory=dict)  # the mode's own arguments from the spec (options_of)
    checkpointing: str = "none"  # activation_checkpointing: none | full | selective
    initialized: bool = field(default=False, repr=False)

    @classmethod
    def options_of(cls, spec: dict) -> dict:
        """The spec's settings this mode hands to its wrapper (ddp: DDP's knobs); none here."""
        return {}

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def partition(self) -> Partition:
        return Partition(self.rank, self.world_size)

    def devices(self) -> list[int]:
        """CUDA device indices this process drives (DP drives several)."""
        return [self.device.index or 0] if self.device.type == "cuda" else []

    # -- the model as this mode trains it ---------------------------------------------------

    def prepare(self, model: nn.Module, amp_dtype: torch.dtype | None, compiled: bool) -> nn.Module:
        """The model wrapped for training, compiled where the mode compiles (`compile: true`).
        single and ddp compile the wrapped model: for DDP that is how PyTorch documents it (Dynamo's
        DDPOptimizer splits the graph at DDP's gradient buckets, so each bucket's all-reduce still
        overlaps the rest of backward). nn.Module.compile compiles in place: the model keeps its
        class and attributes (DDP's no_sync, .module), no wrapper to unwrap. Activation
        checkpointing comes first, in every mode, as torchtitan applies it: the blocks it wraps are
        what compile and DDP or FSDP then see."""
        model = self.wrap(self.checkpointed(model), amp_dtype)
        if compiled:
            model.compile(**COMPILE_OPTIONS)
        return model

    def checkpointed(self, model: nn.Module) -> nn.Module:
        """The model with its blocks wrapped for activation checkpointing (none: as it is)."""
        return checkpointing.apply(model, self.checkpointing)

    def wrap(self, model: nn.Module, amp_dtype: torch.dtype | None) -> nn.Module:
        return model

    # -- the optimizer and the step ----------------------------------------------------------

    def optimizer(
        self, model: nn.Module, spec: dict, amp_dtype: torch.dtype | None
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        """The model as the steps train it, and its optimizer: the study's over the prepared
        model's parameters (dpstudy.engine.optimizers)."""
        return model, optimizers.build(model.parameters(), spec)

    def zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.zero_grad(set_to_none=True)

    def backward(self, loss: torch.Tensor, scaler: torch.amp.GradScaler) -> None:
        """Backward of the step's loss (fp16: scaled by the GradScaler)."""
        scaler.scale(loss).backward()

    def optimizer_step(self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> None:
        scaler.step(optimizer)
        scaler.update()

    def tracker(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        """A memory tracker of the mode's own, following its model and optimizer; None: PyTorch's
        that knows the model's parallelism (dpstudy.engine.memory.tracker_for)."""
        return None

    def autocast(self, amp_dtype: torch.dtype | None):
        """bf16/fp16 through autocast; FSDP casts through its mixed-precision policy instead."""
        if amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=amp_dtype)

    def eval_model(self, model: nn.Module) -> nn.Module:
        """The module evaluation runs: the training model itself, unless the mode says otherwise."""
        return model

    def missing_forwards(self, batches: int) -> int:
        """Extra forward passes this rank must make after its `batches` test batches so that every
        rank makes as many (FSDP's forwards are collectives)."""
        return 0

    # -- process group and collectives: nothing to agree on in one process ------------------

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def all_gather_floats(self, values: list[float]) -> list[float]:
        """Every rank's list, concatenated in rank order."""
        return list(values)

    def all_gather_objects(self, value) -> list:
        """Every rank's picklable `value`, in rank order."""
        return [value]

    def sync_buffers(self, model: nn.Module) -> None:
        """Give every rank rank 0's BatchNorm statistics before evaluating."""

    def comm_device(self) -> torch.device:
        return self.device if self.backend == "nccl" else torch.device("cpu")

    def synchronize(self) -> None:
        for index in self.devices():
            torch.cuda.synchronize(index)


class Single(Mode):
    """One device, one process: the baseline every speedup is measured against."""
