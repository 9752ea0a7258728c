"""What the process-per-device modes (ddp, fsdp) share: torchrun starts one process per device,
each joins the process group, and sums, gathers and BatchNorm statistics cross it."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import ClassVar

import torch
import torch.distributed as dist
import torch.nn as nn

from dpstudy.engine.modes.base import Mode
from dpstudy.util.ports import free_port


class ProcessGroupMode(Mode):
    distributed: ClassVar[bool] = True

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        # torchrun provides MASTER_ADDR/PORT, RANK and WORLD_SIZE; a bare single process does not.
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        kwargs = {"device_id": self.device} if self.backend == "nccl" else {}
        timeout = os.environ.get("DPSTUDY_COLLECTIVE_TIMEOUT_S")  # the study's, from the launcher
        if timeout:
            kwargs["timeout"] = timedelta(seconds=float(timeout))
        # a process that trains strategies one after another on one group (gpu-check's zero item:
        # DeepSpeed keeps the groups it made of the first) starts it once
        if not dist.is_initialized():
            dist.init_process_group(self.backend, rank=self.rank, world_size=self.world_size, **kwargs)
        self.initialized = True

    def close(self) -> None:
        if self.initialized:
            destroy_process_group()
            self.initialized = False

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.initialized:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def all_gather_floats(self, values: list[float]) -> list[float]:
        if not self.initialized:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=self.comm_device())
        out = [torch.empty_like(t) for _ in range(self.world_size)]
        dist.all_gather(out, t)
        return [v for part in out for v in part.tolist()]

    def all_gather_objects(self, value) -> list:
        if not self.initialized:
            return [value]
        out = [None] * self.world_size
        dist.all_gather_object(out, value)
        return out

    def sync_buffers(self, model: nn.Module) -> None:
        if self.initialized:
            for buffer in model.buffers():
                dist.broadcast(buffer, src=0)


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
