"""Where a small CUDA cell's noise and unexplained memory come from, on a GPU host.

    python benchmarks/cuda_noise.py [--rounds 2] [--window-s 0.5] [--windows 6]

1. Noise. SimpleCNN (3x32x32, Adam, fp32, data resident on the device, as the gpu-check forecast
   item trains it) at batches 128 (dispatch-bound on an H100) and 1024, in a fresh process per
   run: `free` (the process as a CUDA cell runs it today: no affinity set, torch's threads) and
   `pinned` (one core, one thread), interleaved round by round. Each run times `windows` windows of
   `window_s` seconds, synchronising the device at their ends, and prints the windows' CV (noise
   inside a process) and their mean; the means' CV across rounds is the noise between processes.
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


def build(batch_sizes):
    import torch

    from dpstudy.models.simplecnn import SimpleCNN

    torch.manual_seed(0)
    model = SimpleCNN(3, 32, 10).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    images = torch.randn(max(batch_sizes) * 8, 3, 32, 32, device="cuda")
    labels = torch.randint(0, 10, (images.shape[0],), device="cuda")
    return model, optimizer, images, labels


def step(model, optimizer, images, labels, batch, i):
    import torch.nn.functional as F

    start = (i * batch) % (images.shape[0] - batch + 1)
    optimizer.zero_grad(set_to_none=True)
    F.cross_entropy(model(images[start : start + batch]), labels[start : start + batch]).backward()
    optimizer.step()


def noise_run(variant: str, window_s: float, windows: int) -> dict:
    if variant == "pinned":
        os.sched_setaffinity(0, [sorted(os.sched_getaffinity(0))[0]])
    import torch

    if variant == "pinned":
        torch.set_num_threads(1)
    model, optimizer, images, labels = build(BATCHES)
    result = {"variant": variant, "threads": torch.get_num_threads()}
    for batch in BATCHES:
        for i in range(30):  # warm-up: cuDNN's choices, the allocator's blocks
            step(model, optimizer, images, labels, batch, i)
        torch.cuda.synchronize()
        rates = []
        for _ in range(windows):
            steps, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < window_s:
                step(model, optimizer, images, labels, batch, steps)
                steps += 1
            torch.cuda.synchronize()
            rates.append(steps * batch / (time.perf_counter() - t0))
        result[f"b{batch}"] = {"mean": statistics.fmean(rates), "cv": statistics.stdev(rates) / statistics.fmean(rates)}
    return result


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
    for variant in [v for _ in range(args.rounds) for v in ("free", "pinned")] + ["memory"]:
        argv = [sys.executable, __file__, "--worker", variant, "--window-s", str(args.window_s)]
        out = subprocess.run([*argv, "--windows", str(args.windows)], capture_output=True, text=True, check=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(runs[-1]), flush=True)
    print(f"\n{'variant':8} {'batch':>5} {'mean samples/s':>15} {'CV in runs':>11} {'CV of means':>12}")
    for variant in ("free", "pinned"):
        mine = [r for r in runs if r["variant"] == variant]
        for batch in BATCHES:
            means = [r[f"b{batch}"]["mean"] for r in mine]
            inside = max(r[f"b{batch}"]["cv"] for r in mine)
            between = statistics.stdev(means) / statistics.fmean(means) if len(means) > 1 else float("nan")
            print(f"{variant:8} {batch:5d} {statistics.fmean(means):15,.0f} {inside:11.2%} {between:12.2%}")
    memory = runs[-1]
    print("\nmax_memory_allocated beyond model and Adam's state, MB (cuDNN on / off):")
    for batch in MEMORY_BATCHES:
        print(f"  batch {batch:5d}: {memory[f'b{batch}_cudnn_on_mb']:8.1f} / {memory[f'b{batch}_cudnn_off_mb']:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
