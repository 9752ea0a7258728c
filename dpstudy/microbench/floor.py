"""The machine's floor: a fixed reference workload, timed beside a study's repeats.

A cell's throughput varies between repeats for two kinds of reason: the machine (another process,
a vCPU that drifts, a GPU's clocks) and the cell's own runtime (the allocator, threads, the garbage
collector). This workload has none of the second kind: its tensors are allocated and touched before
the clock starts and nothing is allocated while it runs, one process pinned like a one-device cell
on the cores (or the GPU) a cell gets. Run once per repeat round, spaced like the cells, the
coefficient of variation of its rates over the rounds is what the machine alone contributes: the
floor below which no cell's noise can go here.

Three parts (dpstudy.engine.reference, of which each cell runs a short gauge too), taking turns of
50 ms over `seconds` (the default, 3 s, is the default study's steady window), so that each part's
rate averages over the whole window as a cell's does:
- compute: square float32 matmuls (GFLOP/s), multi-threaded on the cell's cores, or on the GPU;
- memory: copies of a 256 MiB buffer (past any CPU cache) or 1 GiB on a GPU (GB/s, read plus write);
- dispatch: in-place adds to a one-element tensor (million ops/s): the per-operator cost on the host,
  PyTorch's dispatcher and, on a GPU, the kernel launch. A small model is bound by it (LeNet on an
  H200 runs about 2 ms of host work per step and keeps the GPU 14 % busy), so on a GPU the matmuls
  and copies alone say nothing about the host side that such a cell's noise comes from.

    python -m dpstudy.microbench.floor --repeat 0 --out results/floor/r0.json [--seconds 3] [--device auto]
        [--cores 1]

--cores is the one-device cell's (the train rule's node_cores): a single-device CPU cell trains on one
thread pinned to one core, so its floor must too. A floor on every core of a 2-vCPU VM measured the
two vCPUs together (a 2-thread matmul waits for the slower one): 4-10 % CV beside cells at 4-5 %.
"""

from __future__ import annotations

import argparse
import os
import socket
import time

import torch

from dpstudy.engine.cores import pin_gpu_rank, pin_to_cores, threads_per_process
from dpstudy.engine.monitor import HostLoad
from dpstudy.engine.reference import compute, dispatch, memory, timed_rates
from dpstudy.util.atomic import write_json

DEFAULT_SECONDS = 3.0


def measure(repeat: int, seconds: float = DEFAULT_SECONDS, device: str = "cpu", cores: int | None = None) -> dict:
    """One run of the floor: the rates and what they ran on (a record of dpstudy/study/schema.yaml's
    spirit: flat, every value named)."""
    where = torch.device(device)
    # pinned and threaded as a one-device cell of this study is (dpstudy.engine.cell)
    threads = threads_per_process(cores or len(os.sched_getaffinity(0)), 1)
    pinned = pin_to_cores(0, threads) if where.type == "cpu" else pin_gpu_rank(0, threads)
    torch.set_num_threads(threads)
    load = HostLoad()
    start = load.mark()
    workloads = {"compute_gflops": compute(where), "memory_gbps": memory(where), "dispatch_mops": dispatch(where)}
    rates = timed_rates(workloads, seconds, where)
    busy, own = HostLoad.cores(start, load.mark())
    return {
        "repeat": repeat,
        "device": where.type,
        "device_name": torch.cuda.get_device_name(where) if where.type == "cuda" else None,
        "threads": torch.get_num_threads(),
        "cores": pinned,
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
    parser.add_argument("--cores", type=int, help="the one-device cell's CPU cores (default: every core allowed)")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="auto: cuda if visible")
    args = parser.parse_args(argv)
    if args.seconds <= 0:
        parser.error(f"--seconds {args.seconds}: must be above 0")
    if args.cores is not None and args.cores < 1:
        parser.error(f"--cores {args.cores}: must be 1 or more")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible")
    device = args.device if args.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu"
    run = measure(args.repeat, args.seconds, device, args.cores)
    write_json(args.out, run)
    print(
        f"floor r{run['repeat']} on {run['device']} ({run['threads']} threads): "
        f"{run['compute_gflops']:.1f} GFLOP/s, {run['memory_gbps']:.2f} GB/s, "
        f"{run['dispatch_mops']:.3f} M ops/s, other load {run['other_load']:.2f} cores"
    )
    return 0


if __name__ == "__main__":
    from dpstudy.util.quick_exit import exit_now

    exit_now(main())  # its run is written: skip torch's teardown (dpstudy.util.quick_exit)
