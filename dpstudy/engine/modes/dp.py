"""mode dp: nn.DataParallel, one process driving every GPU of the cell."""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn as nn

from dpstudy.engine.compiling import COMPILE_OPTIONS, CompileFailed
from dpstudy.engine.modes.base import Mode


class DataParallel(Mode):
    name: ClassVar[str] = "dp"

    def devices(self) -> list[int]:
        return list(range(self.gpus)) if self.device.type == "cuda" else []

    def prepare(self, model: nn.Module, amp_dtype: torch.dtype | None, compiled: bool) -> nn.Module:
        """Compiles the module DataParallel will hold, which on one device (or CPU) it calls
        directly. On several GPUs DataParallel replicates the module every step and runs the
        replicas in threads, which torch.compile does not support: such a cell fails with that
        reason (ddp is the way). Activation checkpointing first, as in every mode."""
        model = self.checkpointed(model)
        if compiled:
            if len(self.devices()) > 1:
                raise CompileFailed(
                    "compile: true is not supported with mode dp on several GPUs: nn.DataParallel replicates "
                    "the module every step and runs the replicas in threads, which torch.compile cannot trace "
                    "(compile a ddp cell instead)"
                )
            model.compile(**COMPILE_OPTIONS)
        return self.wrap(model, amp_dtype)

    def wrap(self, model: nn.Module, amp_dtype: torch.dtype | None) -> nn.Module:
        return nn.DataParallel(model, device_ids=self.devices())
