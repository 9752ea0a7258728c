"""Collective bandwidth between processes, per backend and device, as nccl-tests reports it.

Three collectives (the `collective` column): all_reduce (what DDP does to the gradients), and
all_gather and reduce_scatter (what FSDP does to the parameters and the gradients). For each, S
(the `bytes` column, `size` its label) is the TOTAL size of the operation, as nccl-tests'
doc/PERFORMANCE.md defines it:

  all_reduce      S = the tensor every rank holds (input = output, S bytes each)
  all_gather      S = the gathered output; each of the n ranks contributes S/n bytes
  reduce_scatter  S = the input each rank holds; each rank receives its reduced S/n bytes

algbw = S / time, and busbw = algbw x the traffic each link carries in a ring per byte of S, which
makes it comparable across world sizes and collectives: 2(n-1)/n for all_reduce, (n-1)/n for
all_gather and reduce_scatter. (S is rounded down to a multiple of n float32 elements for the two
latter; `bytes` is the size that ran.) The calls are dist.all_reduce, dist.all_gather_into_tensor
and dist.reduce_scatter_tensor (their *_single names where torch has them). Gloo runs both on CPU,
but its reduce_scatter_tensor is an all-reduce of the whole input and a copy of the rank's chunk
(ProcessGroupGloo::reduce_scatter_tensor_coalesced), so its bus bandwidth comes out at about half
of Gloo's all_reduce, or less: what FSDP pays on Gloo, not what a ring reduce-scatter could do.

Each (collective, size): one call on known inputs whose output is checked on every rank (a
collective that computes a wrong result reports no bandwidth; its row gets a `reason`), warm-up
iterations, then per iteration a barrier, synchronize, the collective, synchronize; the slowest
rank's time counts, and the median over iterations is reported (`median_s`, nccl-tests' way).
Then the same calls back to back, with no barrier between them, as DDP issues its buckets during
backward: `stream_s` is their mean time per call (the slowest rank's), what the forecasts' fits
read (dpstudy.analysis.comm_fit). Every process is pinned and threaded as a cell's rank is
(dpstudy.engine.cores): rank r on the r-th block of the cores. Combinations that cannot run here
keep their rows with a `reason`.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dpstudy.engine.cores import pin_to_cores, threads_per_process
from dpstudy.engine.modes.distributed import destroy_process_group
from dpstudy.util.busfactors import bus_factor

COLUMNS = [
    "collective",
    "backend",
    "device",
    "world_size",
    "bytes",
    "size",
    "dtype",
    "iters",
    "median_s",
    "stream_s",
    "algbw_gbps",
    "busbw_gbps",
    "reason",
]
SIZES = [4096 * 4**k for k in range(9)]  # 4 KiB .. 256 MiB, total size S
BIG = 16 << 20  # from here on one call is long enough to need one warm-up call only
# Bytes the timed calls of one size move, at most 50 calls and at least 3: over Gloo here about 0.3 s
# per size from 16 MiB up (a 16 MiB call takes about 25 ms, 64 MiB 100 ms); 3 x 256 MiB take 1.2 s.
TIMED_BYTES = 192 << 20
QUICK_MAX = 4 << 20
COMBOS = (("gloo", "cpu"), ("gloo", "cuda"), ("nccl", "cuda"))
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
# The single-tensor forms; torch >= 2.10 names them *_single and deprecates the *_tensor names.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


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


def sizes_to_time(quick: bool) -> list[int]:
    """The total sizes S a run times: all of SIZES, or with `quick` those up to QUICK_MAX."""
    return [n for n in SIZES if not quick or n <= QUICK_MAX]


def iterations(nbytes: int, quick: bool) -> tuple[int, int]:
    """(warm-up, timed) iterations: many for small messages, fewer where one takes long (a 256 MiB
    call takes 0.3-0.5 s over Gloo here and varies by 1-3 % between calls: three give its
    median; TIMED_BYTES sets the rest); one warm-up call for 16 MiB and more, after the checked
    first call (the buffers are touched, the algorithm chosen), five for the small ones, whose
    first calls still warm caches."""
    if quick:
        return 2, 10
    return (1 if nbytes >= BIG else 5), max(3, min(50, TIMED_BYTES // max(nbytes, 1)))


def collective_call(collective: str, nbytes: int, device: torch.device) -> tuple[int, object, object]:
    """(bytes S that run, the call, a check of its output after the first call) for one collective
    of total size about `nbytes` on float32 tensors. Rank r's inputs make every output element a
    known small integer (exact in float32) that differs per rank and per chunk, so a result from the
    wrong rank or in the wrong place fails the check."""
    n, rank = dist.get_world_size(), dist.get_rank()
    count = max(1, nbytes // 4 // n)  # elements per rank's share of S
    if collective == "all_reduce":
        x = torch.full((nbytes // 4,), float(rank + 1), device=device)

        def check() -> bool:
            ok = bool((x == n * (n + 1) / 2).all())
            x.zero_()  # repeated in-place sums stay finite at any world size
            return ok

        return x.numel() * 4, lambda: dist.all_reduce(x), check
    if collective == "all_gather":
        inp = torch.full((count,), float(rank + 1), device=device)
        out = torch.empty(count * n, device=device)
        expected = torch.arange(1, n + 1, dtype=out.dtype, device=device)[:, None]  # chunk j from rank j
        return out.numel() * 4, lambda: _ALL_GATHER(out, inp), lambda: bool((out.view(n, count) == expected).all())
    if collective == "reduce_scatter":
        # chunk j of rank r's input is (j + 1)(r + 1): rank j receives (j + 1) n(n + 1)/2
        chunks = torch.arange(1, n + 1, dtype=torch.float32, device=device) * (rank + 1)
        inp = chunks.repeat_interleave(count)
        out = torch.empty(count, device=device)
        want = (rank + 1) * n * (n + 1) / 2
        return inp.numel() * 4, lambda: _REDUCE_SCATTER(out, inp), lambda: bool((out == want).all())
    raise ValueError(f"unknown collective {collective!r}")


def _time_size(collective: str, nbytes: int, device: torch.device, backend: str, quick: bool) -> dict:
    size, call, check = collective_call(collective, nbytes, device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    barrier = (lambda: dist.barrier(device_ids=[device.index])) if backend == "nccl" else dist.barrier
    row = {"collective": collective, "bytes": size}
    try:
        call()
    except (RuntimeError, NotImplementedError) as error:
        # A call this backend lacks ("does not support ...", older torch) gets a reason; a failing
        # all_reduce or a communication error (DistBackendError) stops the run, as it always did.
        if collective == "all_reduce" or isinstance(error, dist.DistBackendError):
            raise
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return {**row, "reason": f"{backend} on {device.type} cannot run {collective}: {message}"}
    sync()
    wrong = torch.tensor([0.0 if check() else 1.0], device=device)
    dist.all_reduce(wrong, op=dist.ReduceOp.MAX)  # every rank agrees, so all skip or all time
    if wrong.item():
        return {**row, "reason": f"{collective} returned a wrong result on {backend}/{device.type}"}
    warmup, iters = iterations(nbytes, quick)
    for _ in range(warmup):
        call()
    times = []
    for _ in range(iters):
        barrier()
        sync()
        start = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - start)
    barrier()  # back to back: one start for all the calls, as a backward pass issues its buckets
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        call()
    sync()
    times.append((time.perf_counter() - start) / iters)
    slowest = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return {**row, "iters": iters, "median_s": slowest[:-1].quantile(0.5).item(), "stream_s": slowest[-1].item()}


def _worker(rank: int, world_size: int, store: str, combos: list, sizes: list[int], quick: bool, out: str) -> None:
    threads = threads_per_process(len(os.sched_getaffinity(0)), world_size)  # as a cell's ranks get them
    pin_to_cores(rank, threads)
    torch.set_num_threads(threads)
    rows = []
    for backend, device_type in combos:
        dist.init_process_group(
            backend, init_method=f"file://{store}.{backend}.{device_type}", rank=rank, world_size=world_size
        )
        device = torch.device("cpu")
        if device_type == "cuda":
            device = torch.device("cuda", rank % torch.cuda.device_count())
            torch.cuda.set_device(device)
        rows += [
            {"backend": backend, "device": device_type, **_time_size(c, n, device, backend, quick)}
            for c in COLLECTIVES
            for n in sizes
        ]
        destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps(rows))


def run(quick: bool = False, world_size: int = 2, combos=COMBOS) -> pd.DataFrame:
    """Spawn `world_size` processes, time every collective of COLLECTIVES for every runnable
    (backend, device) of `combos` and every size; the combinations of `combos` that cannot run are
    rows with a reason."""
    sizes = sizes_to_time(quick)
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
        {"collective": c, "backend": b, "device": d, "bytes": n, "reason": reason(b, d, world_size)}
        for b, d in combos
        if (b, d) not in runnable
        for c in COLLECTIVES
        for n in sizes
    ]
    df = pd.DataFrame(measured + skipped, columns=COLUMNS)
    df["world_size"], df["dtype"], df["iters"] = world_size, "float32", df.iters.astype("Int64")
    df["size"] = df["bytes"].map(size_label)
    df["algbw_gbps"] = df.bytes / df.median_s / 1e9
    df["busbw_gbps"] = df.algbw_gbps * df.collective.map(lambda c: bus_factor(c, world_size))
    return df


def sweep(world_sizes: list[int], quick: bool = False, combos=COMBOS) -> pd.DataFrame:
    """run() at each world size, one after another (each its own processes), in one table."""
    return pd.concat([run(quick, n, combos) for n in world_sizes], ignore_index=True)
