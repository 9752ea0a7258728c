"""mode dp: nn.DataParallel, one process driving every GPU of the cell."""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn as nn

from dpstudy.engine import probe
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
        reason (ddp is the way)."""
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

    def probe(self, trainer, steps: int) -> dict | None:
        """Per step: scattering the batch, replicating the model, gathering the outputs."""
        if len(self.devices()) < 2:
            return None
        model: nn.DataParallel = trainer.model
        module, ids = model.module, model.device_ids
        parts = {"scatter_s": 0.0, "replicate_s": 0.0, "gather_s": 0.0}
        with torch.no_grad():
            for x, _ in probe.batches(trainer, steps):
                x = x.to(f"cuda:{ids[0]}")
                inputs = probe.timed(trainer, parts, "scatter_s", lambda x=x: nn.parallel.scatter(x, ids))
                replicas = probe.timed(trainer, parts, "replicate_s", lambda: nn.parallel.replicate(module, ids))
                outputs = nn.parallel.parallel_apply(replicas[: len(inputs)], [(i,) for i in inputs])
                probe.timed(trainer, parts, "gather_s", lambda outputs=outputs: nn.parallel.gather(outputs, ids[0]))
        return {"steps": steps, **{k: v / steps for k, v in parts.items()}}
