"""After training: the parts of a step that the step model needs (dpstudy.analysis.step_model).

Each mode with collectives has its probe here, chosen by the mode's name (PROBES): DDP times its
step with and without the gradient all-reduce and the all-reduce alone, FSDP its step as sharded,
on an unsharded replica and its all-gathers and reduce-scatters alone, DP its scatter, replicate
and gather. A probe reads the mode's public attributes; the mode knows nothing of it. The probe
runs after the last evaluation, takes no optimizer step and leaves the gradients empty, so it
changes nothing the record reports. Times are the slowest rank's.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn

from dpstudy.engine import compiling, grad_layout, objective
from dpstudy.record.fields import PROBE_FIELDS

STEPS = 8
# A step that takes long varies little relative to its length: a variant stops adding steps once
# they would take more than PROBE_S (at least MIN_STEPS, an average of two), so slow models on
# CPU do not spend longer probing than training.
PROBE_S = 2.0
MIN_STEPS = 2
# A step with its communication and the same step without it take turns in ROUNDS rounds, so a
# drift of the machine touches both alike; the rounds' differences give the exposed time's spread.
ROUNDS = 4


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


def batches(trainer, count: int) -> list:
    trainer.train_data.set_epoch(trainer.spec["epochs"] + 1)
    return list(itertools.islice(iter(trainer.train_data), count))


def affordable_steps(trainer, warm_up_s: float, steps: int) -> int:
    """`steps`, or fewer when the slowest rank's warm-up step says they would pass PROBE_S (the
    same number on every rank: each step is collective)."""
    slowest = max(trainer.mode.all_gather_floats([warm_up_s]))
    return max(MIN_STEPS, min(steps, math.ceil(PROBE_S / slowest))) if slowest > 0 else steps


def timed_once(trainer, work) -> float:
    trainer.mode.synchronize()
    start = time.perf_counter()
    work()
    trainer.mode.synchronize()
    return time.perf_counter() - start


def per_step(trainer, work, steps: int) -> float:
    """Seconds per call of work() over `steps` calls, after a device synchronize."""
    trainer.mode.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        work()
    trainer.mode.synchronize()
    return (time.perf_counter() - start) / steps


def interleaved(trainer, with_comm, without_comm, steps: int) -> dict:
    """`with_comm` and `without_comm` timed in turns over ROUNDS rounds of about steps / ROUNDS
    steps each (at least one), each round's times the slowest rank's: the median step of each
    (sync_step_s, nosync_step_s), the median of the rounds' differences (exposed_s, the
    communication the step did not hide) and their interquartile range (exposed_spread_s)."""
    each = max(1, math.ceil(steps / ROUNDS))
    times = []
    for _ in range(ROUNDS):
        times += [per_step(trainer, with_comm, each), per_step(trainer, without_comm, each)]
    every = trainer.mode.all_gather_floats(times)  # rank by rank
    worst = [max(every[i :: len(times)]) for i in range(len(times))]
    synced, unsynced = worst[0::2], worst[1::2]
    exposed = [a - b for a, b in zip(synced, unsynced, strict=True)]
    quartiles = statistics.quantiles(exposed, n=4, method="inclusive")
    return {
        "sync_step_s": statistics.median(synced),
        "nosync_step_s": statistics.median(unsynced),
        "exposed_s": statistics.median(exposed),
        "exposed_spread_s": quartiles[2] - quartiles[0],
        "rounds": ROUNDS,
    }


def timed(trainer, totals: dict, key: str, work):
    """work()'s result; its seconds (between device synchronizes) added to totals[key]."""
    trainer.mode.synchronize()
    start = time.perf_counter()
    result = work()
    trainer.mode.synchronize()
    totals[key] += time.perf_counter() - start
    return result


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
PROBES = {"dp": probe_dp, "ddp": probe_ddp, "fsdp": probe_fsdp}
