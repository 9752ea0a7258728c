"""mode ddp: DistributedDataParallel, one process per device, gradients all-reduced in buckets
while backward runs."""

from __future__ import annotations

import contextlib
import itertools
from typing import ClassVar

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from dpstudy.engine import grad_layout, probe
from dpstudy.engine.modes.distributed import ProcessGroupMode
from dpstudy.study.spec import DDP_KNOBS


class DistributedDataParallel(ProcessGroupMode):
    name: ClassVar[str] = "ddp"

    @classmethod
    def options_of(cls, spec: dict) -> dict:
        """DDP's knobs the study sets (bucket_cap_mb ...); a null one keeps DDP's default."""
        return {key: spec[key] for key in DDP_KNOBS if spec.get(key) is not None}

    def wrap(self, model: nn.Module, amp_dtype: torch.dtype | None) -> nn.Module:
        ids = [self.device.index] if self.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids, **self.options)

    def eval_model(self, model: nn.Module) -> nn.Module:
        return model.module  # DDP's forward is for training (it prepares the gradient reduction)

    def probe(self, trainer, steps: int) -> dict | None:
        """A step's forward and backward with the gradient all-reduce and without it (no_sync),
        taking turns (probe.interleaved), and one all-reduce of the gradients' bytes alone: their
        difference is the all-reduce time backward did not hide; against the all-reduce alone it
        gives the overlap DDP achieved."""
        if self.world_size < 2:
            return None
        model = trainer.model
        model.train()
        data = itertools.cycle(probe.batches(trainer, steps))

        def step(sync: bool):
            def work():
                x, y = next(data)
                with contextlib.nullcontext() if sync else model.no_sync():
                    with trainer.autocast():
                        loss = F.cross_entropy(model(x), y)
                    loss.backward()
                model.zero_grad(set_to_none=True)

            return work

        params = [p for p in model.parameters() if p.requires_grad]
        flat = torch.zeros(sum(p.numel() for p in params), dtype=torch.float32, device=params[0].device)
        warm_up_s = probe.timed_once(trainer, step(True))
        for work in (step(False), lambda: dist.all_reduce(flat)):  # warm-up
            work()
        dist.barrier()
        steps = probe.affordable_steps(trainer, warm_up_s, steps)
        turns = probe.interleaved(trainer, step(True), step(False), steps)
        dist.barrier()
        allreduce = probe.per_step(trainer, lambda: dist.all_reduce(flat), steps)
        return {
            "steps": steps,
            **turns,
            "allreduce_s": max(self.all_gather_floats([allreduce])),
            "grad_bytes": flat.numel() * flat.element_size(),
            # the messages a forecast prices, each with its latency: DDP's own buckets, and the
            # units FSDP would make of the same model (a forecast of FSDP from this cell)
            "buckets": len(grad_layout.ddp_buckets(model.module, self.options.get("bucket_cap_mb"))),
            "units": len(grad_layout.fsdp_units(model.module)),
        }
