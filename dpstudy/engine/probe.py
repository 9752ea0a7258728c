"""After training: the parts of a step that the step model needs (dpstudy.analysis.step_model).

Each mode with collectives has its probe, chosen by the mode's name (PROBES): DDP times its step
with and without the gradient all-reduce and the all-reduce alone, FSDP its step as sharded, on an
unsharded replica and its all-gathers and reduce-scatters alone, DP its scatter, replicate and
gather, ZeRO its whole step against an unsharded replica's (dpstudy.engine.zero_probe). A probe
reads the mode's public attributes; the mode knows nothing of it. The probe runs after the last
evaluation and changes nothing the record reports (DDP's and FSDP's take no optimizer step and
leave the gradients empty). Times are the slowest rank's; how they are taken is
dpstudy.engine.probe_timing's.
"""

from __future__ import annotations

import contextlib
import itertools
import math

import torch
import torch.distributed as dist
import torch.nn as nn

from dpstudy.engine import compiling, grad_layout, objective
from dpstudy.engine.probe_timing import STEPS, affordable_steps, batches, interleaved, per_step, timed, timed_once
from dpstudy.engine.zero_probe import probe_deepspeed
from dpstudy.record.fields import PROBE_FIELDS


def measure(trainer, steps: int = STEPS) -> dict | None:
    """The mode's probe (PROBES; None for a mode without one); a compiled model's also counts the
    graphs it compiled (`graphs_compiled`: the steps it times are training's, whose graphs exist,
    so a count above 0 is a path of its own, e.g. DDP's no_sync)."""
    probe = PROBES.get(trainer.mode.name)
    graphs = compiling.compiled_graphs()
    found = probe(trainer, steps) if probe else None
    if found is None:
        return None
    if trainer.compiled:
        found["graphs_compiled"] = compiling.compiled_graphs() - graphs
    unknown = sorted(set(found) - set(PROBE_FIELDS))
    if unknown:  # a mode's probe may time only what the record defines (dpstudy.record.fields)
        raise ValueError(f"mode {trainer.mode.name}'s probe returned fields the record does not define: {unknown}")
    return found


def probe_dp(trainer, steps: int) -> dict | None:
    """Per step: scattering the batch, replicating the model, gathering the outputs."""
    if len(trainer.mode.devices()) < 2:
        return None
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


def probe_ddp(trainer, steps: int) -> dict | None:
    """A step's forward and backward with the gradient all-reduce and without it (no_sync), taking
    turns (interleaved), and one all-reduce of the gradients' bytes alone: their difference is the
    all-reduce time backward did not hide; against the all-reduce alone it gives the overlap DDP
    achieved."""
    mode, model = trainer.mode, trainer.model
    if mode.world_size < 2:
        return None
    model.train()
    data = itertools.cycle(batches(trainer, steps))

    def step(sync: bool):
        def work():
            x, y = next(data)
            with contextlib.nullcontext() if sync else model.no_sync():
                with trainer.autocast():
                    loss = objective.loss(model(x), y)
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
    turns = interleaved(trainer, step(True), step(False), steps)
    dist.barrier()
    allreduce = per_step(trainer, lambda: dist.all_reduce(flat), steps)
    return {
        "steps": steps,
        **turns,
        "allreduce_s": max(mode.all_gather_floats([allreduce])),
        "grad_bytes": flat.numel() * flat.element_size(),
        # the messages a forecast prices, each with its latency: DDP's own buckets, and the units
        # FSDP would make of the same model (a forecast of FSDP from this cell)
        "buckets": len(grad_layout.ddp_buckets(model.module, mode.options.get("bucket_cap_mb"))),
        "units": len(grad_layout.fsdp_units(model.module)),
    }


def probe_fsdp(trainer, steps: int) -> dict | None:
    """A step's forward and backward as FSDP runs it and the same step on an unsharded replica of
    the model (no collective at all: its compute), taking turns (interleaved), and its collectives
    alone: one all-gather of every unit's parameters, and the reduce-scatter of every unit's
    gradients."""
    mode, model = trainer.mode, trainer.model
    if mode.world_size < 2:
        return None
    from torch.distributed.fsdp import FSDPModule

    model.train()
    data = itertools.cycle(batches(trainer, steps))
    # The compute of the same step without FSDP: a replica of the architecture built as the cell's
    # model was (weights do not change its time), cast as FSDP's policy casts (autocast stands in
    # for the bf16/fp16 copies). No forward of the measured model is needed for it.
    replica = trainer.build_replica()
    amp = trainer.amp_dtype

    def step(net: nn.Module, cast):
        def work():
            x, y = next(data)
            with cast():
                loss = objective.loss(net(x), y)
            loss.backward()
            net.zero_grad(set_to_none=True)

        return work

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    # each unit's parameters, not its sub-units' (a root that holds none gathers nothing)
    sizes = [n for n in (own_numel(unit) for unit in units) if n > 0]
    world = mode.world_size
    gather_size = torch.finfo(amp).bits // 8 if amp is not None else 4
    buffers = [
        (
            torch.zeros(math.ceil(n / world) * world, device=mode.device),
            torch.empty(math.ceil(n / world), device=mode.device),
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
    compute = step(replica, lambda: torch.autocast(mode.device.type, dtype=amp) if amp else contextlib.nullcontext())
    warm_up_s = timed_once(trainer, sharded)
    for work in (compute, all_gather, reduce_scatter):  # warm-up
        work()
    dist.barrier()
    steps = affordable_steps(trainer, warm_up_s, steps)
    turns = interleaved(trainer, sharded, compute, steps)
    times = [per_step(trainer, work, steps) for work in (all_gather, reduce_scatter)]
    slowest = mode.all_gather_floats(times)
    del replica
    return {
        "steps": steps,
        **turns,
        "allgather_s": max(slowest[0::2]),
        "reduce_scatter_s": max(slowest[1::2]),
        "gather_bytes": sum(sizes) * gather_size,
        "grad_bytes": sum(sizes) * 4,  # reduced in fp32 (the policy's reduce_dtype, or fp32 params)
        "units": len(sizes),
    }


def own_numel(unit: nn.Module) -> int:
    """Elements of the parameters FSDP manages in `unit` itself, those of nested units left out."""
    from torch.distributed.fsdp import FSDPModule

    nested = {id(p) for m in unit.modules() if m is not unit and isinstance(m, FSDPModule) for p in m.parameters()}
    return sum(p.numel() for p in unit.parameters() if id(p) not in nested)


# The probe of each mode with collectives to time, by mode name (dpstudy.engine.modes.MODES).
PROBES = {"dp": probe_dp, "ddp": probe_ddp, "fsdp": probe_fsdp, "deepspeed": probe_deepspeed}
