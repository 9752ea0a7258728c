"""The machine's floor: a fixed reference workload, timed beside a study's repeats.

A cell's throughput varies between repeats for two kinds of reason: the machine (another process,
a vCPU that drifts, a GPU's clocks) and the cell's own runtime (the allocator, threads, the garbage
collector). This workload has none of the second kind: its tensors are allocated and touched before
the clock starts and nothing is allocated while it runs, one process pinned like a one-device cell
on the cores (or the GPU) a cell gets. Run once per repeat round, spaced like the cells, the
coefficient of variation of its rates over the rounds is what the machine alone contributes: the
floor below which no cell's noise can go here.

Three parts of `seconds` together (the default, 3 s, is the default study's steady window):
- compute: square float32 matmuls (GFLOP/s), multi-threaded on the cell's cores, or on the GPU;
- memory: copies of a 256 MiB buffer (past any CPU cache) or 1 GiB on a GPU (GB/s, read plus write);
- dispatch: in-place adds to a one-element tensor (million ops/s): the per-operator cost on the host,
  PyTorch's dispatcher and, on a GPU, the kernel launch. A small model is bound by it (LeNet on an
  H200 runs about 2 ms of host work per step and keeps the GPU 14 % busy), so on a GPU the matmuls
  and copies alone say nothing about the host side that such a cell's noise comes from.

    python -m dpstudy.microbench.floor --repeat 0 --out results/floor/r0.json [--seconds 3] [--device auto]
"""

from __future__ import annotations

import argparse
import os
import socket
import time
from collections.abc import Callable

import torch

from dpstudy.engine.cores import pin_to_cores, threads_per_process
from dpstudy.engine.monitor import HostLoad
from dpstudy.util.atomic import write_json

DEFAULT_SECONDS = 3.0
WORKLOADS = ("compute", "memory", "dispatch")
MATMUL_N = {"cpu": 256, "cuda": 4096}
COPY_BYTES = {"cpu": 256 * 2**20, "cuda": 2**30}
DISPATCH_BATCH = 64  # operators per timed step: the loop's own Python cost stays small beside them
WARMUP_S = 0.3  # thread pools spun up, clocks raised, pages resident: outside the timed window


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_rate(step: Callable[[], None], work: float, seconds: float, device: torch.device) -> float:
    """`work` units per second of `step`, repeated for about `seconds` after a warm-up."""
    for budget, measure in ((WARMUP_S, False), (seconds, True)):
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
                    break
        if measure:
            return steps * work / elapsed
    raise AssertionError("unreachable")


def compute(device: torch.device, seconds: float) -> float:
    """GFLOP/s of n x n float32 matmuls."""
    n = MATMUL_N[device.type]
    a, b = (torch.randn(n, n, device=device) for _ in range(2))
    out = torch.empty(n, n, device=device)
    return timed_rate(lambda: torch.mm(a, b, out=out), 2 * n**3 / 1e9, seconds, device)


def memory(device: torch.device, seconds: float) -> float:
    """GB/s of copying one buffer into another (bytes read plus bytes written)."""
    count = COPY_BYTES[device.type] // 4
    src = torch.ones(count, device=device)
    dst = torch.zeros(count, device=device)
    return timed_rate(lambda: dst.copy_(src), 2 * count * 4 / 1e9, seconds, device)


def dispatch(device: torch.device, seconds: float) -> float:
    """Million operators per second: tiny in-place adds, each a full trip through the dispatcher
    (and a kernel launch on a GPU) with next to no work in it."""
    x = torch.zeros(1, device=device)

    def step() -> None:
        for _ in range(DISPATCH_BATCH):
            x.add_(1.0)

    return timed_rate(step, DISPATCH_BATCH / 1e6, seconds, device)


def measure(repeat: int, seconds: float = DEFAULT_SECONDS, device: str = "cpu") -> dict:
    """One run of the floor: the rates and what they ran on (a record of dpstudy/study/schema.yaml's
    spirit: flat, every value named)."""
    where = torch.device(device)
    cores: list[int] = []
    if where.type == "cpu":
        threads = threads_per_process(len(os.sched_getaffinity(0)), 1)
        cores = pin_to_cores(0, threads)
        torch.set_num_threads(threads)
    load = HostLoad()
    start = load.mark()
    part = seconds / len(WORKLOADS)
    rates = {
        "compute_gflops": compute(where, part),
        "memory_gbps": memory(where, part),
        "dispatch_mops": dispatch(where, part),
    }
    busy, own = HostLoad.cores(start, load.mark())
    return {
        "repeat": repeat,
        "device": where.type,
        "device_name": torch.cuda.get_device_name(where) if where.type == "cuda" else None,
        "threads": torch.get_num_threads(),
        "cores": cores,
        "seconds": seconds,
        **rates,
        # the cores the rest of the machine kept busy meanwhile, as a cell's other_load
        "other_load": max(0.0, busy - own),
        "host": socket.gethostname(),
        "finished": time.time(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, required=True, help="the repeat round this run belongs to")
    parser.add_argument("--out", required=True, help="the JSON file to write")
    parser.add_argument("--seconds", type=float, default=DEFAULT_SECONDS, help="timed seconds, all three parts")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="auto: cuda if visible")
    args = parser.parse_args(argv)
    if args.seconds <= 0:
        parser.error(f"--seconds {args.seconds}: must be above 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible")
    device = args.device if args.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
    run = measure(args.repeat, args.seconds, device)
    write_json(args.out, run)
    print(
        f"floor r{run['repeat']} on {run['device']} ({run['threads']} threads): "
        f"{run['compute_gflops']:.1f} GFLOP/s, {run['memory_gbps']:.2f} GB/s, "
        f"{run['dispatch_mops']:.3f} M ops/s, other load {run['other_load']:.2f} cores"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
