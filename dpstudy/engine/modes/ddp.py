"""mode ddp: DistributedDataParallel, one process per device, gradients all-reduced in buckets
while backward runs."""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn as nn

from dpstudy.engine.modes.distributed import ProcessGroupMode
from dpstudy.study import modes


class DistributedDataParallel(ProcessGroupMode):
    name: ClassVar[str] = "ddp"

    @classmethod
    def options_of(cls, spec: dict) -> dict:
        """DDP's knobs the study sets (bucket_cap_mb ...); a null one keeps DDP's default."""
        return {key: spec[key] for key in modes.TABLE[cls.name].knobs if spec.get(key) is not None}

    def wrap(self, model: nn.Module, amp_dtype: torch.dtype | None) -> nn.Module:
        ids = [self.device.index] if self.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids, **self.options)

    def eval_model(self, model: nn.Module) -> nn.Module:
        return model.module  # DDP's forward is for training (it prepares the gradient reduction)
