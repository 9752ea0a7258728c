"""The probe of mode deepspeed (dpstudy.engine.probe.PROBES): a ZeRO step against its compute, and
its collectives counted under the profiler and timed alone."""

from __future__ import annotations

import contextlib
import itertools
import math

import torch
import torch.distributed as dist

from dpstudy.engine import objective, optimizers
from dpstudy.engine.probe_timing import affordable_steps, batches, interleaved, per_step, timed_once


def probe_deepspeed(trainer, steps: int) -> dict | None:
    """A training step as the ZeRO engine runs it (forward, backward, the step: every collective of
    its stage) and the same step on an unsharded replica with the plain optimizer (its compute),
    taking turns (interleaved); the step's collectives counted and sized once under the profiler
    (zero_collectives), and each kind alone at those sizes. The probe's steps change the weights,
    as the memory step and the trace after it do; every reported number was measured before."""
    mode = trainer.mode
    if mode.world_size < 2:
        return None
    trainer.model.train()
    data = itertools.cycle(batches(trainer, steps))
    replica = trainer.build_replica()
    plain = optimizers.build(replica.parameters(), trainer.spec)
    amp = trainer.amp_dtype

    def zero_step():
        trainer.step(*next(data))

    def compute():
        x, y = next(data)
        with torch.autocast(mode.device.type, dtype=amp) if amp else contextlib.nullcontext():
            loss = objective.loss(replica(x), y)
        loss.backward()
        plain.step()
        plain.zero_grad(set_to_none=True)

    warm_up_s = timed_once(trainer, zero_step)
    compute()  # warm-up
    counted = zero_collectives(zero_step)
    dist.barrier()
    steps = affordable_steps(trainer, warm_up_s, steps)
    turns = interleaved(trainer, zero_step, compute, steps)
    alone = {
        c: max(mode.all_gather_floats([per_step(trainer, alone_work(mode, c, b), steps)]))
        for c, (_, b) in counted.items()
    }
    reduced = counted.get("all_reduce") or counted.get("reduce_scatter") or (0, 0.0)
    gathered = counted.get("all_gather", (0, 0.0))
    found = {"steps": steps, **turns, "grad_bytes": int(reduced[1]), "buckets": reduced[0]}
    found |= {"gather_bytes": int(gathered[1]), "gathers": gathered[0]}
    names = {"all_reduce": "allreduce_s", "all_gather": "allgather_s", "reduce_scatter": "reduce_scatter_s"}
    return found | {names[c]: seconds for c, seconds in alone.items()}


def alone_work(mode, collective: str, nbytes: float):
    """One call of `collective` over `nbytes` in float32 (comm_bench's sizes), warmed up."""
    full = torch.zeros(max(1, math.ceil(nbytes / 4 / mode.world_size)) * mode.world_size, device=mode.comm_device())
    part = torch.empty(full.numel() // mode.world_size, device=full.device)
    work = {
        "all_reduce": lambda: dist.all_reduce(full),
        "all_gather": lambda: dist.all_gather_into_tensor(full, part),
        "reduce_scatter": lambda: dist.reduce_scatter_tensor(part, full),
    }[collective]
    work()
    return work


# The process group's operators a ZeRO step calls, by the collective comm_bench times; their
# tensors' bytes as comm_bench counts them (an all-gather's gathered output, a reduce-scatter's input)
C10D = {"c10d::_allgather_base_": ("all_gather", 0), "c10d::_reduce_scatter_base_": ("reduce_scatter", 1)}


def zero_collectives(step) -> dict[str, tuple[int, float]]:
    """{collective: (calls, bytes)} of one step() under the profiler. All-gathers and reduce-scatters
    by their operators' shapes; all-reduces by the backend's own spans (gloo:all_reduce,
    nccl:all_reduce), whose operator does not record its tensors' shapes, less the spans of Gloo's
    reduce-scatter, which it runs as an all-reduce of its input; a one-element all-reduce (the
    gradients' norm, the overflow check) is no message of the step's."""
    from torch.profiler import ProfilerActivity, profile

    from dpstudy.engine.trace_figures import DTYPE_BYTES

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        step()
    sizes: dict[str, list[float]] = {"all_reduce": [], "all_gather": [], "reduce_scatter": []}
    for event in prof.events():
        shapes, dtypes = event.input_shapes or [], getattr(event, "input_dtypes", None) or []
        if event.name in C10D:
            collective, which = C10D[event.name]
        elif event.name.endswith(("gloo:all_reduce", "nccl:all_reduce")):
            collective, which = "all_reduce", 0
        else:
            continue
        if len(shapes) <= which or len(dtypes) <= which or math.prod(shapes[which] or [1]) <= 1:
            continue
        sizes[collective].append(math.prod(shapes[which]) * DTYPE_BYTES.get(str(dtypes[which]).lower(), 4))
    for nbytes in sizes["reduce_scatter"]:
        if nbytes in sizes["all_reduce"]:
            sizes["all_reduce"].remove(nbytes)
    return {c: (len(each), float(sum(each))) for c, each in sizes.items() if each}
