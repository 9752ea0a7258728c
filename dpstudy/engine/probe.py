"""After training: the parts of a step that the scaling model needs (dpstudy.analysis.scaling).

DDP (more than one rank): a step's forward and backward with the gradient all-reduce and without
it (`no_sync`), and one all-reduce of the gradients' bytes alone. Their difference is the
all-reduce time the backward did not hide; against the all-reduce alone it gives the overlap DDP
achieved. FSDP (more than one rank): a step's forward and backward as FSDP runs it, the same step
on an unsharded replica of the model (no collective at all: its compute), and its collectives
alone: one all-gather of every unit's parameters, and the reduce-scatter of every unit's
gradients. DP (several GPUs): per step, scattering the batch, replicating the model and gathering
the outputs. The probe runs after the last evaluation, takes no optimizer step and leaves the
gradients empty, so it changes nothing the record reports. Times are the slowest rank's.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from dpstudy.engine import compiling

STEPS = 8
# A step that takes long varies little relative to its length: a variant stops adding steps once
# they would take more than PROBE_S (at least MIN_STEPS, an average of two), so slow models on
# CPU do not spend longer probing than training.
PROBE_S = 2.0
MIN_STEPS = 2


def measure(trainer, steps: int = STEPS) -> dict | None:
    """The mode's probe; a compiled model's also counts the graphs it compiled (`graphs_compiled`:
    the steps it times are training's, whose graphs exist, so a count above 0 is a path of its own,
    e.g. DDP's no_sync)."""
    par = trainer.par
    graphs = compiling.compiled_graphs()
    if par.mode == "ddp" and par.world_size > 1:
        found = ddp_overlap(trainer, steps)
    elif par.mode == "fsdp" and par.world_size > 1:
        found = fsdp_overlap(trainer, steps)
    elif par.mode == "dp" and len(par.devices()) > 1:
        found = dp_transfers(trainer, steps)
    else:
        return None
    if trainer.compiled:
        found["graphs_compiled"] = compiling.compiled_graphs() - graphs
    return found


def batches(trainer, count: int) -> list:
    trainer.train_data.set_epoch(trainer.spec["epochs"] + 1)
    return list(itertools.islice(iter(trainer.train_data), count))


def affordable_steps(trainer, warm_up_s: float, steps: int) -> int:
    """`steps`, or fewer when the slowest rank's warm-up step says they would pass PROBE_S (the
    same number on every rank: each step is collective)."""
    slowest = max(trainer.par.all_gather_floats([warm_up_s]))
    return max(MIN_STEPS, min(steps, math.ceil(PROBE_S / slowest))) if slowest > 0 else steps


def timed_once(trainer, work) -> float:
    trainer.par.synchronize()
    start = time.perf_counter()
    work()
    trainer.par.synchronize()
    return time.perf_counter() - start


def per_step(trainer, work, steps: int) -> float:
    """Seconds per call of work() over `steps` calls, after a device synchronize."""
    trainer.par.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        work()
    trainer.par.synchronize()
    return (time.perf_counter() - start) / steps


def ddp_overlap(trainer, steps: int) -> dict:
    model, par = trainer.model, trainer.par
    model.train()
    data = itertools.cycle(batches(trainer, steps))

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
    warm_up_s = timed_once(trainer, step(True))
    for work in (step(False), lambda: dist.all_reduce(flat)):  # warm-up
        work()
    dist.barrier()
    steps = affordable_steps(trainer, warm_up_s, steps)
    sync = per_step(trainer, step(True), steps)
    nosync = per_step(trainer, step(False), steps)
    dist.barrier()
    allreduce = per_step(trainer, lambda: dist.all_reduce(flat), steps)
    slowest = par.all_gather_floats([sync, nosync, allreduce])
    return {
        "steps": steps,
        "sync_step_s": max(slowest[0::3]),
        "nosync_step_s": max(slowest[1::3]),
        "allreduce_s": max(slowest[2::3]),
        "grad_bytes": flat.numel() * flat.element_size(),
    }


def fsdp_overlap(trainer, steps: int) -> dict:
    from torch.distributed.fsdp import FSDPModule

    from dpstudy import models

    model, par = trainer.model, trainer.par
    model.train()
    inputs = batches(trainer, steps)
    data = itertools.cycle(inputs)
    x0 = inputs[0][0]
    with torch.no_grad(), compiling.eager(trainer.compiled):  # a shape: not worth graphs of its own
        classes = model(x0[:1]).shape[1]
    # The compute of the same step without FSDP: a replica of the architecture (weights do not
    # change its time), cast as FSDP's policy casts (autocast stands in for the bf16/fp16 copies).
    spec = trainer.spec
    replica = models.build(spec["model"], x0.shape[1], x0.shape[2], classes, spec["model_args"], spec["code_path"])
    replica = replica.to(par.device)
    if trainer.spec["channels_last"]:
        replica = replica.to(memory_format=torch.channels_last)
    amp = trainer.amp_dtype

    def step(net: nn.Module, cast):
        def work():
            x, y = next(data)
            with cast():
                loss = F.cross_entropy(net(x).float(), y)
            loss.backward()
            net.zero_grad(set_to_none=True)

        return work

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    # each unit's parameters, not its sub-units' (a root that holds none gathers nothing)
    sizes = [n for n in (own_numel(unit) for unit in units) if n > 0]
    world = par.world_size
    gather_size = torch.finfo(amp).bits // 8 if amp is not None else 4
    buffers = [
        (
            torch.zeros(math.ceil(n / world) * world, device=par.device),
            torch.empty(math.ceil(n / world), device=par.device),
        )
        for n in sizes
    ]

    def all_gather():
        for unit in units:
            unit.unshard()
        for unit in units:
            unit.reshard()

    def reduce_scatter():
        for full, shard in buffers:
            dist.reduce_scatter_tensor(shard, full)

    sharded = step(model, contextlib.nullcontext)
    compute = step(replica, lambda: torch.autocast(par.device.type, dtype=amp) if amp else contextlib.nullcontext())
    warm_up_s = timed_once(trainer, sharded)
    for work in (compute, all_gather, reduce_scatter):  # warm-up
        work()
    dist.barrier()
    steps = affordable_steps(trainer, warm_up_s, steps)
    times = [per_step(trainer, work, steps) for work in (sharded, compute, all_gather, reduce_scatter)]
    slowest = par.all_gather_floats(times)
    del replica
    return {
        "steps": steps,
        "sync_step_s": max(slowest[0::4]),
        "nosync_step_s": max(slowest[1::4]),
        "allgather_s": max(slowest[2::4]),
        "reduce_scatter_s": max(slowest[3::4]),
        "gather_bytes": sum(sizes) * gather_size,
        "grad_bytes": sum(sizes) * 4,  # reduced in fp32 (the policy's reduce_dtype, or fp32 params)
        "units": len(sizes),
    }


def own_numel(unit: nn.Module) -> int:
    """Elements of the parameters FSDP manages in `unit` itself, those of nested units left out."""
    from torch.distributed.fsdp import FSDPModule

    nested = {id(p) for m in unit.modules() if m is not unit and isinstance(m, FSDPModule) for p in m.parameters()}
    return sum(p.numel() for p in unit.parameters() if id(p) not in nested)


def dp_transfers(trainer, steps: int) -> dict:
    model: nn.DataParallel = trainer.model
    module, ids = model.module, model.device_ids
    parts = {"scatter_s": 0.0, "replicate_s": 0.0, "gather_s": 0.0}
    with torch.no_grad():
        for x, _ in batches(trainer, steps):
            x = x.to(f"cuda:{ids[0]}")
            inputs = timed(trainer, parts, "scatter_s", lambda x=x: nn.parallel.scatter(x, ids))
            replicas = timed(trainer, parts, "replicate_s", lambda: nn.parallel.replicate(module, ids))
            outputs = nn.parallel.parallel_apply(replicas[: len(inputs)], [(i,) for i in inputs])
            timed(trainer, parts, "gather_s", lambda outputs=outputs: nn.parallel.gather(outputs, ids[0]))
    return {"steps": steps, **{k: v / steps for k, v in parts.items()}}


def timed(trainer, totals: dict, key: str, work):
    trainer.par.synchronize()
    start = time.perf_counter()
    result = work()
    trainer.par.synchronize()
    totals[key] += time.perf_counter() - start
    return result
