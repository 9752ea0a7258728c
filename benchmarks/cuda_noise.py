"""Where a small CUDA cell's noise and unexplained memory come from, on a GPU host.

    python benchmarks/cuda_noise.py [--rounds 2] [--window-s 0.5] [--windows 6]

1. Noise. SimpleCNN (3x32x32, Adam, fp32, data resident on the device, as the gpu-check forecast
   item trains it) at batches 128 (dispatch-bound on an H100) and 1024, in a fresh process per
   run, the VARIANTS interleaved round by round: free, pinned as cells are, on the last core, with
   the garbage collector off, and the step as one CUDA graph (the device without the host's
   launches). Each run times `windows` windows of `window_s` seconds, synchronising the device at
   their ends, and prints the windows' CV (noise inside a process) and their mean; the means' CV
   across rounds is the noise between processes. After each window a fixed pure-Python loop runs
   on the same core: its CV ("host CV") is the core's own speed moving, no GPU involved; and the
   hypervisor's stolen time over the runs is printed.
2. Memory. The same model's max_memory_allocated over three training steps beyond what the model,
   its gradients and Adam's state hold, per batch, with cuDNN on and off: what cuDNN's workspaces
   add, which no tracker on fake tensors sees.

Prints one JSON line per run and a summary table. Needs a GPU (exits 77 without one).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

BATCHES = (128, 1024)
MEMORY_BATCHES = (128, 256, 512, 1024)
# A CUDA cell's rank today: pinned to the first core of its GPU's share, one thread. The others
# each change one thing against it, to tell where a dispatch-bound step's noise comes from.
VARIANTS = {
    "free": "no affinity, torch's threads (as CUDA cells ran before they were pinned)",
    "pinned": "the first core, one thread (as CUDA cells run now)",
    "last": "the last core, one thread (away from core 0's interrupts)",
    "nogc": "the last core, one thread, Python's garbage collector frozen and off in the windows",
    "graphed": "the last core, one thread, the whole step one CUDA graph (no launches: the device alone)",
}
HOST_REF_S = 0.1  # after each window: a fixed pure-Python loop's rate on the same core


def build(batch_sizes, capturable=False):
    import torch

    from dpstudy.models.simplecnn import SimpleCNN

    torch.manual_seed(0)
    model = SimpleCNN(3, 32, 10).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=capturable)
    images = torch.randn(max(batch_sizes) * 8, 3, 32, 32, device="cuda")
    labels = torch.randint(0, 10, (images.shape[0],), device="cuda")
    return model, optimizer, images, labels


def step(model, optimizer, images, labels, batch, i):
    import torch.nn.functional as F

    start = (i * batch) % (images.shape[0] - batch + 1)
    optimizer.zero_grad(set_to_none=True)
    F.cross_entropy(model(images[start : start + batch]), labels[start : start + batch]).backward()
    optimizer.step()


def graphed_step(model, optimizer, images, labels, batch):
    """The step captured once as a CUDA graph (PyTorch's whole-network capture); returns a
    function of the step number that copies that step's batch in and replays the graph."""
    import torch
    import torch.nn.functional as F

    x, y = images[:batch].clone(), labels[:batch].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as capture requires
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        F.cross_entropy(model(x), y).backward()
        optimizer.step()

    def run(i):
        start = (i * batch) % (images.shape[0] - batch + 1)
        x.copy_(images[start : start + batch])
        y.copy_(labels[start : start + batch])
        graph.replay()

    return run


def host_rate(seconds: float) -> float:
    """Iterations per second of a fixed pure-Python loop: the core's own speed, no device."""
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        total = 0
        for k in range(1000):
            total += k * k
        n += 1
    return n / (time.perf_counter() - t0)


def steal_ticks() -> int | None:
    """The host's stolen ticks so far (/proc/stat: what the hypervisor gave to others)."""
    try:
        with open("/proc/stat") as f:
            return int(f.readline().split()[8])
    except (OSError, IndexError, ValueError):
        return None


def noise_run(variant: str, window_s: float, windows: int) -> dict:
    import gc

    cores = sorted(os.sched_getaffinity(0))
    if variant != "free":
        os.sched_setaffinity(0, [cores[0] if variant == "pinned" else cores[-1]])
    import torch

    if variant != "free":
        torch.set_num_threads(1)
    model, optimizer, images, labels = build(BATCHES, capturable=variant == "graphed")
    result = {"variant": variant, "threads": torch.get_num_threads(), "cores": sorted(os.sched_getaffinity(0))[:4]}
    stolen = steal_ticks()
    for batch in BATCHES:
        for i in range(30):  # warm-up: cuDNN's choices, the allocator's blocks
            step(model, optimizer, images, labels, batch, i)
        run = graphed_step(model, optimizer, images, labels, batch) if variant == "graphed" else None
        run = run or (lambda i, b=batch: step(model, optimizer, images, labels, b, i))
        torch.cuda.synchronize()
        if variant == "nogc":
            gc.collect()
            gc.freeze()
            gc.disable()
        rates, hosts = [], []
        for _ in range(windows):
            steps, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < window_s:
                run(steps)
                steps += 1
            torch.cuda.synchronize()
            rates.append(steps * batch / (time.perf_counter() - t0))
            hosts.append(host_rate(HOST_REF_S))
        gc.enable()
        result[f"b{batch}"] = {"mean": statistics.fmean(rates), "cv": cv(rates), "host_cv": cv(hosts)}
    if stolen is not None:
        result["steal_s"] = (steal_ticks() - stolen) / os.sysconf("SC_CLK_TCK")
    return result


def cv(values: list[float]) -> float:
    return statistics.stdev(values) / statistics.fmean(values)


def memory_run() -> dict:
    import torch

    model, optimizer, images, labels = build(MEMORY_BATCHES)
    step(model, optimizer, images, labels, 8, 0)  # Adam's state exists from here on
    torch.cuda.synchronize()
    rows = {}
    for cudnn in (True, False):
        torch.backends.cudnn.enabled = cudnn
        for batch in MEMORY_BATCHES:
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            for i in range(3):
                step(model, optimizer, images, labels, batch, i)
            torch.cuda.synchronize()
            rows[f"b{batch}_cudnn_{'on' if cudnn else 'off'}_mb"] = (torch.cuda.max_memory_allocated() - base) / 2**20
    return {"variant": "memory", "data_mb": images.numel() * 4 / 2**20, **rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--window-s", type=float, default=0.5)
    parser.add_argument("--windows", type=int, default=6)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        made = memory_run() if args.worker == "memory" else noise_run(args.worker, args.window_s, args.windows)
        print(json.dumps(made), flush=True)
        return 0
    import torch

    if not torch.cuda.is_available():
        print("cuda_noise: no CUDA device", file=sys.stderr)
        return 77
    runs = []
    for variant in [v for _ in range(args.rounds) for v in VARIANTS] + ["memory"]:
        argv = [sys.executable, __file__, "--worker", variant, "--window-s", str(args.window_s)]
        out = subprocess.run([*argv, "--windows", str(args.windows)], capture_output=True, text=True)
        if out.returncode:
            print(f"{variant}: exit status {out.returncode}\n{out.stderr[-2000:]}", flush=True)
            continue
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(runs[-1]), flush=True)
    print(f"\n{'variant':8} {'batch':>5} {'mean samples/s':>15} {'CV in runs':>11} {'CV of means':>12} {'host CV':>8}")
    for variant in VARIANTS:
        mine = [r for r in runs if r["variant"] == variant]
        for batch in BATCHES if mine else ():
            means = [r[f"b{batch}"]["mean"] for r in mine]
            inside = max(r[f"b{batch}"]["cv"] for r in mine)
            host = max(r[f"b{batch}"]["host_cv"] for r in mine)
            between = statistics.stdev(means) / statistics.fmean(means) if len(means) > 1 else float("nan")
            print(f"{variant:8} {batch:5d} {statistics.fmean(means):15,.0f} {inside:11.2%} {between:12.2%} {host:8.2%}")
    for variant, meaning in VARIANTS.items():
        print(f"  {variant}: {meaning}")
    print(f"host CPU time stolen by the hypervisor during the runs: {sum(r.get('steal_s', 0) for r in runs):.2f} s")
    if not runs or runs[-1]["variant"] != "memory":
        return 1
    memory = runs[-1]
    print("\nmax_memory_allocated beyond model and Adam's state, MB (cuDNN on / off):")
    for batch in MEMORY_BATCHES:
        print(f"  batch {batch:5d}: {memory[f'b{batch}_cudnn_on_mb']:8.1f} / {memory[f'b{batch}_cudnn_off_mb']:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
