"""After training: one training step's peak memory on each device, split by what holds it.

PyTorch's own trackers count tensors as they are created (a TorchDispatchMode), so they work on
the CPU, where there is no allocator to ask, as on CUDA, and under FakeTensorMode for a prediction:
`MemTracker` (single, dp, ddp) and `FSDPMemTracker` (fsdp), both from torch.distributed._tools.
Their categories fold into four parts:

  params       parameters and buffers (FSDP: this rank's shards, and the unsharded parameters
               that all-gathers create for forward and backward)
  grads        gradients (FSDP: the unsharded gradients and the reduce-scatter's input, then the
               sharded ones)
  optimizer    optimizer state (momentum, Adam's moments)
  activations  what forward keeps for backward, backward's temporaries and the step's inputs

The split is the one at the step's peak (their sum is that peak). Tensors that exist before the
step and are neither the model's, the optimizer's nor created by it (the dataset a `device` loader
keeps resident, DDP's gradient buckets) are not counted. On CUDA the same step is also read from
the allocator and the driver (record.fields.ALLOCATOR_PARTS): max_memory_allocated holds those
tensors too, max_memory_reserved the caching allocator's segments, and the process's memory in
NVML beyond them is the CUDA context and the libraries' own buffers; `resident_mb` says how much of
the allocated memory is a `device` loader's data. On a CPU, with no allocator peak to read, the
process's resident memory over the step is (HOST_PARTS: its peak, reset before the step, minus
what it held before). The step is one more training step after the last evaluation, so the
record's numbers do not change.
"""

from __future__ import annotations

import math

import torch

from dpstudy.engine.monitor import process_used_mb, reset_rss_peak, rss_kib
from dpstudy.record.fields import ALLOCATOR_PARTS, HOST_PARTS

PARTS = {
    "params": ("PARAM", "BUFFER", "SHARDED_PARAM", "UNSHARDED_PARAM", "ALL_GATHER"),
    "grads": ("GRAD", "SHARDED_GRAD", "UNSHARDED_GRAD", "REDUCE_SCATTER"),
    "optimizer": ("OPT",),
    "activations": ("ACT", "TEMP", "INP", "OTH"),
}
MB = 2**20


def tracker_for(model: torch.nn.Module, optimizer: torch.optim.Optimizer):
    """The tracker that knows this model's parallelism, already following model and optimizer."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

        return FSDPMemTracker(model, optimizer)
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    return tracker


def split(snapshot: dict) -> dict[str, float]:
    """A tracker's per-device snapshot ({category: bytes, 'Total': bytes}) as the four parts in MB."""
    by_name = {getattr(key, "name", key): value for key, value in snapshot.items()}
    unknown = set(by_name) - {"Total", *(c for names in PARTS.values() for c in names)}
    if unknown:  # a category of a newer torch: fold it into activations rather than lose it
        by_name["OTH"] = by_name.get("OTH", 0) + sum(by_name[c] for c in unknown)
    parts = {part: sum(by_name.get(c, 0) for c in names) / MB for part, names in PARTS.items()}
    return {**parts, "peak": by_name["Total"] / MB}


def tracked(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step, tracker=None):
    """The tracker (`tracker`, already following model and optimizer: a mode's own, Mode.tracker;
    else tracker_for's) after `step()`, one training step, ran under it: its peaks, and per module
    the peaks inside each module's forward and backward (dpstudy.workflow.workspaces)."""
    tracker = tracker or tracker_for(model, optimizer)
    with tracker:
        step()
    return tracker


def peak_split(tracker) -> dict[torch.device, dict]:
    """{device: the four parts and the peak (MB)} at a tracker's peak."""
    peaks = tracker.get_tracker_snapshot("peak")
    return {device: split(snapshot) for device, snapshot in peaks.items() if snapshot.get("Total", 0) > 0}


def tracked_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step, tracker=None) -> dict:
    """{device: the four parts and the peak (MB)} of `step()`, one training step (`tracker`: see tracked)."""
    return peak_split(tracked(model, optimizer, step, tracker))


def resident_mb(loaders, device: int) -> float:
    """MB of the data the loaders keep on CUDA device `device` (a `device` loader's splits)."""
    held = [getattr(loader, name, None) for loader in loaders for name in ("images", "labels", "tokens")]
    on_device = [t for t in held if isinstance(t, torch.Tensor) and t.device == torch.device("cuda", device)]
    return sum(t.untyped_storage().nbytes() for t in on_device) / MB


def allocator_step(devices: list[int], step, loaders) -> tuple[object, list[dict[str, float | None]]]:
    """Run `step()` with the CUDA devices' peaks reset before it: its result, and per device the
    allocator's and the driver's view of it (record.fields.ALLOCATOR_PARTS)."""
    for d in devices:
        torch.cuda.synchronize(d)
        torch.cuda.reset_peak_memory_stats(d)
    result = step()
    views = []
    for d in devices:
        torch.cuda.synchronize(d)
        used = process_used_mb(d)
        reserved_now = torch.cuda.memory_reserved(d) / MB
        views.append(
            {
                "allocated_mb": torch.cuda.max_memory_allocated(d) / MB,
                "reserved_mb": torch.cuda.max_memory_reserved(d) / MB,
                "context_mb": None if used is None else used - reserved_now,
                "total_mb": torch.cuda.get_device_properties(d).total_memory / MB,
                "resident_mb": resident_mb(loaders, d),
            }
        )
    return result, views


def host_step(step) -> tuple[object, dict[str, float | None]]:
    """Run `step()` with this process's peak resident memory reset before it (a CPU cell): its
    result, and how much the resident memory grew over it (record.fields.HOST_PARTS)."""
    reset = reset_rss_peak()
    before = rss_kib("VmHWM")  # the peak's own counter, right after its reset
    result = step()
    peak = rss_kib("VmHWM")
    # the kernel counts a thread's resident pages in batches of 64 and raises the peak lazily, so a
    # step that grows the process by less than that can read a little below 0 (-0.15 MB seen): none
    growth = max(0.0, peak - before) / 1024 if reset and peak is not None and before is not None else None
    return result, {"rss_growth_mb": growth}


def measure(trainer) -> dict[str, list[float]]:
    """Every rank's split of one training step, gathered in rank order (see the docstring); a
    device the tracker saw nothing on is None:
    {"params_mb": [...], "grads_mb": [...], "optimizer_mb": [...], "activations_mb": [...],
    "peak_mb": [...]}, one value per device (DP: each of its GPUs); on CUDA also the
    ALLOCATOR_PARTS of the same step, on a CPU its HOST_PARTS."""
    mode = trainer.mode
    # a batch of its own: a `device` loader's batch is a view into a larger chunk of converted
    # images, whose whole storage the tracker would count once an op makes a view of the batch
    # (ZeRO-3's hooks do), as the step's; the fake step of the plan has no such chunk either
    x, y = (t.clone() for t in next(iter(trainer.train_data)))
    trainer.model.train()
    cuda = mode.devices()
    loaders = (trainer.train_data, trainer.test_data)

    def step():
        tracker = mode.tracker(trainer.model, trainer.optimizer)
        return tracked_step(trainer.model, trainer.optimizer, lambda: trainer.step(x, y), tracker)

    if cuda:
        per_device, views = allocator_step(cuda, step, loaders)
    else:
        per_device, host = host_step(step)
        views = [host]
    devices = cuda or [None]  # None: the CPU
    mine = [per_device.get(torch.device("cuda", d) if d is not None else torch.device("cpu")) for d in devices]
    # every rank of a cell drives CUDA or none does: the gathered lists line up
    keys = [*PARTS, "peak", *(part.removesuffix("_mb") for part in (ALLOCATOR_PARTS if cuda else HOST_PARTS))]
    values = [v for part, view in zip(mine, views, strict=True) for v in _row(part, view)]
    gathered = [None if math.isnan(v) else v for v in mode.all_gather_floats(values)]  # None: JSON's null
    return {f"{k}_mb": gathered[i :: len(keys)] for i, k in enumerate(keys)}


def _row(part: dict | None, view: dict) -> list[float]:
    """One device's tracker parts and peak, then its allocator view, NaN for what is unknown."""
    tracker = [part[k] if part else math.nan for k in (*PARTS, "peak")]
    return tracker + [math.nan if value is None else value for value in view.values()]
