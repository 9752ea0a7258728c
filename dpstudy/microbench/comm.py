"""all_reduce bandwidth between 2 processes, per backend and device, as nccl-tests reports it.

algbw = bytes / time; busbw = algbw * 2(n-1)/n for all_reduce (the traffic each link carries in
a ring, comparable across world sizes). Each size: warm-up iterations, then per iteration a
barrier, synchronize, all_reduce, synchronize; the slowest rank's time counts, and the median
over iterations is reported. Combinations that cannot run here keep their rows with a `reason`.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dpstudy.engine.parallel import destroy_process_group

COLUMNS = [
    "backend",
    "device",
    "world_size",
    "bytes",
    "size",
    "dtype",
    "iters",
    "median_s",
    "algbw_gbps",
    "busbw_gbps",
    "reason",
]
SIZES = [4096 * 4**k for k in range(9)]  # 4 KiB .. 256 MiB
QUICK_MAX = 4 << 20
COMBOS = (("gloo", "cpu"), ("gloo", "cuda"), ("nccl", "cuda"))


def size_label(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def reason(backend: str, device: str, world_size: int) -> str | None:
    """Why a combination cannot run on this machine, or None."""
    gpus = torch.cuda.device_count()
    if device == "cuda" and gpus == 0:
        return "no CUDA device"
    if backend == "nccl" and not dist.is_nccl_available():
        return "torch built without NCCL"
    if backend == "nccl" and gpus < world_size:
        return f"NCCL needs {world_size} GPUs, found {gpus}"
    return None


def iterations(nbytes: int, quick: bool) -> tuple[int, int]:
    """(warm-up, timed) iterations: many for small messages, fewer where one takes long."""
    if quick:
        return 2, 10
    return 5, max(5, min(50, (256 << 20) * 5 // max(nbytes, 1)))


def _time_size(nbytes: int, device: torch.device, backend: str, quick: bool) -> dict:
    tensor = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    barrier = (lambda: dist.barrier(device_ids=[device.index])) if backend == "nccl" else dist.barrier
    warmup, iters = iterations(nbytes, quick)
    for _ in range(warmup):
        dist.all_reduce(tensor)
    times = []
    for _ in range(iters):
        barrier()
        sync()
        start = time.perf_counter()
        dist.all_reduce(tensor)
        sync()
        times.append(time.perf_counter() - start)
    slowest = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return {"bytes": nbytes, "iters": iters, "median_s": slowest.quantile(0.5).item()}


def _worker(rank: int, world_size: int, store: str, combos: list, sizes: list[int], quick: bool, out: str) -> None:
    rows = []
    for backend, device_type in combos:
        dist.init_process_group(
            backend, init_method=f"file://{store}.{backend}.{device_type}", rank=rank, world_size=world_size
        )
        device = torch.device("cpu")
        if device_type == "cuda":
            device = torch.device("cuda", rank % torch.cuda.device_count())
            torch.cuda.set_device(device)
        rows += [{"backend": backend, "device": device_type, **_time_size(n, device, backend, quick)} for n in sizes]
        destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps(rows))


def run(quick: bool = False, world_size: int = 2, combos=COMBOS) -> pd.DataFrame:
    """Spawn `world_size` processes, time all_reduce for every runnable (backend, device) of
    `combos` and every size; the combinations of `combos` that cannot run are rows with a reason."""
    sizes = [n for n in SIZES if not quick or n <= QUICK_MAX]
    combos = [tuple(c) for c in combos]
    runnable = [c for c in combos if reason(*c, world_size) is None]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "rows.json")
        mp.start_processes(
            _worker,
            args=(world_size, str(Path(tmp, "store")), runnable, sizes, quick, str(out)),
            nprocs=world_size,
            start_method="spawn",
        )
        measured = json.loads(out.read_text())
    skipped = [
        {"backend": b, "device": d, "bytes": n, "reason": reason(b, d, world_size)}
        for b, d in combos
        if (b, d) not in runnable
        for n in sizes
    ]
    df = pd.DataFrame(measured + skipped, columns=COLUMNS)
    df["world_size"], df["dtype"], df["iters"] = world_size, "float32", df.iters.astype("Int64")
    df["size"] = df["bytes"].map(size_label)
    df["algbw_gbps"] = df.bytes / df.median_s / 1e9
    df["busbw_gbps"] = df.algbw_gbps * 2 * (world_size - 1) / world_size
    return df
