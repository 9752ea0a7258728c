"""The machine's reference workload: fixed work with nothing allocated while it is timed, whose
rate moves only when the machine does. dpstudy.microbench.floor runs it as a job of its own beside
a study's repeats; a cell runs a short gauge of it after each epoch (InCell), so that the
machine's speed is known at the moments the cell trained.

Three parts, taking turns of SLICE_S:
- compute: square float32 matmuls (GFLOP/s), on the process's threads, or on the GPU;
- memory: copies of a buffer past any CPU cache (GB/s, read plus write);
- dispatch: in-place adds to a one-element tensor (million ops/s): the per-operator cost on the
  host, PyTorch's dispatcher and, on a GPU, the kernel launch.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from dpstudy.record.fields import IN_CELL_RATES

MATMUL_N = {"cpu": 256, "cuda": 4096}
COPY_BYTES = {"cpu": 256 * 2**20, "cuda": 2**30}
DISPATCH_BATCH = 64  # operators per timed step: the loop's own Python cost stays small beside them
WARMUP_S = 0.3  # thread pools spun up, clocks raised, pages resident: outside the timed window
SLICE_S = 0.05  # each workload's turn: many turns in a window, each long against a step (a CPU copy: ~15 ms)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


Workload = tuple[Callable[[], None], float]  # one step, and the units of work it does


def run_for(step: Callable[[], None], budget: float, device: torch.device) -> tuple[int, float]:
    """Repeat `step` for at least `budget` seconds: (steps, seconds they took)."""
    sync(device)
    start = time.perf_counter()
    steps = 0
    while True:
        step()
        steps += 1
        if steps % 8 == 0 or device.type == "cpu":
            sync(device)
            elapsed = time.perf_counter() - start
            if elapsed >= budget:
                return steps, elapsed


def timed_rates(
    workloads: dict[str, Workload], seconds: float, device: torch.device, warmup: float = WARMUP_S
) -> dict[str, float]:
    """Units of work per second of each workload, after `warmup` seconds of them, the workloads taking turns of
    SLICE_S over the same `seconds`. A cell's steps mix compute, memory traffic and dispatch over its
    whole steady window, so a slow second of the machine touches all of them; timed one after another,
    each part over a third of the window, the parts varied more than the cells did (CV 4-5 % beside
    single-device cells at 1.5-2 %, benchmarks/noise_floor.py)."""
    for step, _ in workloads.values():
        if warmup > 0:
            run_for(step, warmup / len(workloads), device)
    done = {name: [0, 0.0] for name in workloads}
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for name, (step, _) in workloads.items():
            steps, elapsed = run_for(step, SLICE_S, device)
            done[name][0] += steps
            done[name][1] += elapsed
    return {name: done[name][0] * work / done[name][1] for name, (_, work) in workloads.items()}


def compute(device: torch.device, n: int | None = None) -> Workload:
    """n x n float32 matmuls (default MATMUL_N), in GFLOP."""
    n = n or MATMUL_N[device.type]
    a, b = (torch.randn(n, n, device=device) for _ in range(2))
    out = torch.empty(n, n, device=device)
    return (lambda: torch.mm(a, b, out=out)), 2 * n**3 / 1e9


def memory(device: torch.device, nbytes: int | None = None) -> Workload:
    """Copies of one buffer of `nbytes` (default COPY_BYTES) into another, in GB (bytes read plus
    bytes written)."""
    count = (nbytes or COPY_BYTES[device.type]) // 4
    src = torch.ones(count, device=device)
    dst = torch.zeros(count, device=device)
    return (lambda: dst.copy_(src)), 2 * count * 4 / 1e9


def dispatch(device: torch.device) -> Workload:
    """Tiny in-place adds, in millions: each a full trip through the dispatcher (and a kernel launch
    on a GPU) with next to no work in it."""
    x = torch.zeros(1, device=device)

    def step() -> None:
        for _ in range(DISPATCH_BATCH):
            x.add_(1.0)

    return step, DISPATCH_BATCH / 1e6


# The gauge inside a cell, after each epoch's evaluation and outside every timed step: one turn
# (SLICE_S) of each part. Small matmuls, and on a CPU copies of a 32 MiB buffer (a server CPU's L3)
# together with its target: a LeNet cell slowed for two epochs while the matmuls and the dispatch
# read normal, and the floor's copies were its noisiest part (benchmarks/noise_source.py). No copies on
# a GPU: their buffers would stay in the caching allocator's reserve.
IN_CELL_MATMUL_N = {"cpu": 256, "cuda": 1024}
IN_CELL_COPY_BYTES = 32 * 2**20


class InCell:
    """The reference workload inside a cell's process, on its device and threads. Its tensors exist
    only while it runs (after the epoch's memory peaks are read, before the next epoch resets them),
    so that no peak of the cell holds them."""

    def __init__(self, device: torch.device):
        self.device = device
        self.warmed = False

    def rates(self) -> dict[str, float]:
        """{name: rate} of IN_CELL_RATES (the record's names; no copies on a GPU), one turn each,
        the first call after a turn of each part to warm its code paths (the cell's threads are awake)."""
        gflops, mops, gbps = IN_CELL_RATES
        parts = {gflops: compute(self.device, IN_CELL_MATMUL_N[self.device.type]), mops: dispatch(self.device)}
        if self.device.type == "cpu":
            parts[gbps] = memory(self.device, IN_CELL_COPY_BYTES)
        turns = len(parts) * SLICE_S
        rates = timed_rates(parts, turns, self.device, warmup=0.0 if self.warmed else turns)
        self.warmed = True
        return rates
