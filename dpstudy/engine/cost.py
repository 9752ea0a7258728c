"""What one training sample of a cell costs, counted once before training: the record's `cost`
(dpstudy.record.schema.COST_FIELDS). FLOPs are counted on the meta device (dpstudy.models.flops),
so counting costs no compute and needs no GPU; a model the meta device cannot run gets no count and
the reason, never a guess."""

from __future__ import annotations

from collections.abc import Callable

import torch.nn as nn

from dpstudy.data.task import Task


def measure(spec: dict, task: Task, build: Callable[[], nn.Module]) -> dict:
    """`build` makes the cell's model where the current default device says (no .to(device)):
    the count builds it on the meta device."""
    from dpstudy.engine import checkpointing
    from dpstudy.models import flops

    cost = {
        "task": task.kind,
        "tokens_per_sample": task.tokens_per_sample,
        "flops_per_sample": None,
        "hardware_flops_per_sample": None,
        "flops_reason": None,
    }
    how = spec.get("activation_checkpointing") or "none"
    try:
        cost["flops_per_sample"] = flops.train_flops_per_sample(build, task)
        if how != "none":
            recompute = flops.train_flops_per_sample(build, task, prepare=lambda m: checkpointing.apply(m, how))
            cost["hardware_flops_per_sample"] = recompute
    except Exception as error:  # e.g. an operator without a meta kernel: the record says why
        first = (str(error).strip().splitlines() or [""])[0]
        cost["flops_reason"] = f"not counted on the meta device: {type(error).__name__}: {first}"
    return cost
