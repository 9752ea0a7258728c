"""One rank's profiler trace of a few training steps (dpstudy.engine.tracing) reduced to the parts
of its step: interval arithmetic over the Chrome-trace events torch.profiler exports. No torch here.

The intervals, per `dpstudy:step` span (the training thread is the thread these are on):

  data      the `dpstudy:data` spans: the step waiting for its batch
  compute   with device activity in the trace (CUDA): the device's kernels, memory copies and sets
            but the collectives'; on a CPU: the training thread's dispatcher operators (aten::mm,
            fsdp::chunk_cat: a namespace) but the collectives' and the waits, nested ones counted
            once. Autograd's nodes and Python's functions are left out: a thread blocked on a
            collective is outside any operator (DDP's end of backward) or in such a function with
            no operator running (FSDP's post-backward hook waiting for its reduce-scatter).
  comm      the collectives in flight: on a CPU each Gloo collective from when the training thread
            issued it (its c10d:: operator) to the end of its `gloo:*` span on Gloo's own thread,
            which runs it; NCCL's kernels on a device

Per step, a partition of its span (the four add up to step_s exactly):

  data_wait_s     data
  compute_s       compute outside data
  exposed_comm_s  comm outside compute and data: the communication on the step's critical path
  idle_s          the rest: the host's own time between operators (Python, the dispatcher, hooks)
                  and waits with no collective running (a slower peer)

and beside it comm_s, every collective's time hidden or not (overlap = 1 - exposed / comm). The
figures are the median step's (the step whose length is the median of the traced steps, the lower
of the two middle ones): one slow step moves nothing, and the four parts still add up to its
length; step_spread_s is the interquartile range of the steps' lengths. Per collective: its calls,
bytes (of the tensor the rank handed it) and seconds, means per step over every traced step.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict

STEP, DATA = "dpstudy:step", "dpstudy:data"
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
# dispatcher operators (a namespace) that compute: not those of collectives, waits or autograd's engine
OPERATOR = re.compile(r"^[\w.]+::")
NOT_COMPUTE = re.compile(r"^(c10d::|_c10d_functional::|autograd::|torch::autograd::)|wait", re.IGNORECASE)
# c10d operators that issue no Gloo work of their own
NOT_ISSUED = {"c10d::barrier", "c10d::monitored_barrier_"}
NCCL_KERNEL = re.compile(r"nccl", re.IGNORECASE)
# NCCL's kernel names (ncclDevKernel_AllReduce_Sum_f32_RING_LL) and Gloo's spans (gloo:all_reduce)
# named as the collectives are: all_reduce, all_gather, reduce_scatter, ...
KERNEL_COLLECTIVE = re.compile(r"(AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|SendRecv|AllToAll)")
DTYPE_BYTES = {
    "float": 4, "double": 8, "c10::half": 2, "c10::bfloat16": 2, "half": 2, "bfloat16": 2, "long int": 8,
    "int": 4, "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1,
    "float32": 4, "float64": 8, "float16": 2, "int64": 8, "int32": 4, "uint8": 1, "int8": 1,
}  # fmt: skip
PARTS = ("data_wait_s", "compute_s", "exposed_comm_s", "idle_s")


def union(intervals) -> list[tuple[float, float]]:
    """Sorted, disjoint intervals covering the same time as `intervals` ((start, end) pairs)."""
    merged: list[list[float]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def minus(keep, remove) -> list[tuple[float, float]]:
    """The parts of the disjoint intervals `keep` that no interval of the disjoint `remove` covers."""
    out, removed = [], list(remove)
    for start, end in keep:
        at = start
        for a, b in removed:
            if b <= at or a >= end:
                continue
            if a > at:
                out.append((at, a))
            at = max(at, b)
        if at < end:
            out.append((at, end))
    return out


def clip(intervals, start: float, end: float) -> list[tuple[float, float]]:
    return [(max(a, start), min(b, end)) for a, b in intervals if b > start and a < end]


def length(intervals) -> float:
    return sum(b - a for a, b in intervals)


def span(event: dict) -> tuple[float, float]:
    return float(event["ts"]), float(event["ts"]) + float(event.get("dur", 0))


def in_flight(spans: list[dict], issued: list[dict]) -> list[tuple[float, float]]:
    """Each Gloo collective from when the training thread issued it (its c10d:: operator) to the end
    of its span on Gloo's thread: until a worker thread takes it up, the step waits on it too (on a
    busy CPU, for milliseconds). Gloo's queue is first in, first out, so the k-th issue is the k-th
    span to start; where the counts differ (an operator that issues none), the spans alone."""
    ordered = sorted(spans, key=lambda e: float(e["ts"]))
    if len(ordered) != len(issued):
        return [span(e) for e in ordered]
    starts = sorted(float(e["ts"]) for e in issued)
    return [(min(start, span(e)[0]), span(e)[1]) for start, e in zip(starts, ordered, strict=True)]


def is_compute(name: str) -> bool:
    return bool(OPERATOR.match(name)) and not NOT_COMPUTE.search(name)


def collective_of(name: str) -> str | None:
    """all_reduce, all_gather, ... for a Gloo or NCCL span or an NCCL kernel; None for anything else."""
    if name.startswith(("gloo:", "nccl:")):
        return name.split(":", 1)[1]
    found = KERNEL_COLLECTIVE.search(name) if NCCL_KERNEL.search(name) else None
    return re.sub(r"(?<!^)(?=[A-Z])", "_", found.group(1)).lower() if found else None


def nbytes(event: dict) -> float:
    """Bytes of the tensor a collective's span was handed (record_shapes: its dims and dtype), NaN
    when the span does not say."""
    args = event.get("args") or {}
    if "In msg nelems" in args:  # record_param_comms's fields (NCCL)
        size = DTYPE_BYTES.get(str(args.get("dtype", "")).lower())
        return float(args["In msg nelems"]) * size if size else math.nan
    dims, types = args.get("Input Dims") or [], args.get("Input type") or []
    if not dims or not types or dims[0] is None:
        return math.nan
    size = DTYPE_BYTES.get(str(types[0]).lower())  # dims [] is a scalar: one element
    return float(math.prod(dims[0])) * size if size else math.nan


def reduce(events: list[dict]) -> dict:
    """The figures of one rank's trace (see the module's docstring); ValueError when it holds no step."""
    complete = [e for e in events if e.get("ph") == "X" and "ts" in e]
    steps = sorted((e for e in complete if e.get("name") == STEP), key=lambda e: float(e["ts"]))
    if not steps:
        raise ValueError(f"the trace holds no {STEP!r} span: nothing to reduce")
    thread = (steps[0].get("pid"), steps[0].get("tid"))
    on_device = any(e.get("cat") in DEVICE_CATS for e in complete)
    data = union(span(e) for e in complete if e.get("name") == DATA)
    if on_device:
        device = [e for e in complete if e.get("cat") in DEVICE_CATS]
        compute = union(span(e) for e in device if not NCCL_KERNEL.search(e.get("name", "")))
        comm_events = [e for e in device if collective_of(e.get("name", ""))]
        comm_events += [e for e in complete if e.get("name", "").startswith("gloo:")]  # Gloo with CUDA tensors
    else:
        ops = [e for e in complete if (e.get("pid"), e.get("tid")) == thread and e.get("cat") == "cpu_op"]
        compute = union(span(e) for e in ops if is_compute(e.get("name", "")))
        comm_events = [e for e in complete if e.get("name", "").startswith(("gloo:", "nccl:"))]
        issued = [e for e in ops if e.get("name", "").startswith("c10d::") and e.get("name") not in NOT_ISSUED]
    comm = union(in_flight(comm_events, issued) if not on_device else map(span, comm_events))
    split = [partition(span(s), data, compute, comm) for s in steps]
    n = len(split)
    # the median step (the lower middle one of an even count): one slow step moves nothing, and its
    # parts still add up to it
    figures = sorted(split, key=lambda p: p["step_s"])[(n - 1) // 2]
    quartiles = statistics.quantiles([p["step_s"] for p in split], n=4, method="inclusive") if n > 1 else [0, 0, 0]
    figures["step_spread_s"] = quartiles[2] - quartiles[0]
    figures["overlap"] = 1 - figures["exposed_comm_s"] / figures["comm_s"] if figures["comm_s"] > 0 else None
    return {
        "steps": n,
        "activity": "cuda" if on_device else "cpu",
        **figures,
        "collectives": collectives(comm_events, complete, steps),
    }


def partition(window: tuple[float, float], data, compute, comm) -> dict[str, float]:
    """One step's parts, in seconds (the trace's microseconds / 1e6); see the module's docstring."""
    start, end = window
    busy_data = clip(data, start, end)
    busy_compute = minus(clip(compute, start, end), busy_data)
    in_flight = clip(comm, start, end)
    exposed = minus(minus(in_flight, busy_compute), busy_data)
    parts = {
        "step_s": end - start,
        "data_wait_s": length(busy_data),
        "compute_s": length(busy_compute),
        "exposed_comm_s": length(exposed),
        "comm_s": length(in_flight),
    }
    parts = {key: value / 1e6 for key, value in parts.items()}
    parts["idle_s"] = max(0.0, parts["step_s"] - sum(parts[k] for k in PARTS if k != "idle_s"))
    return parts


def collectives(comm_events: list[dict], events: list[dict], steps: list[dict]) -> dict[str, dict]:
    """{collective: {calls, bytes, seconds}} per step, of the collectives that started within a step;
    bytes from the Gloo or NCCL spans that carry shapes (an NCCL kernel's are its span's)."""
    windows = [span(s) for s in steps]

    def inside(event) -> bool:
        start = float(event["ts"])
        return any(a <= start < b for a, b in windows)

    out: dict[str, dict] = defaultdict(lambda: {"calls": 0, "bytes": 0.0, "seconds": 0.0})
    for event in filter(inside, comm_events):
        kind = collective_of(event["name"])
        if kind:
            out[kind]["calls"] += 1
            out[kind]["seconds"] += float(event.get("dur", 0)) / 1e6
    sized = [e for e in events if e.get("name", "").startswith(("gloo:", "nccl:")) and inside(e)]
    for event in sized:
        kind = collective_of(event["name"])
        if kind in out:
            out[kind]["bytes"] += nbytes(event)
    n = len(steps)
    return {
        kind: {
            "calls": v["calls"] / n,
            "bytes": None if math.isnan(v["bytes"]) else v["bytes"] / n,
            "seconds": v["seconds"] / n,
        }
        for kind, v in sorted(out.items())
    }
