"""What cuDNN's convolution workspaces add to a training step's allocator peak, against what the
memory plan predicts for them (dpstudy.workflow.workspaces), on a GPU host.

    python benchmarks/cuda_workspace.py [--models simplecnn resnet18] [--batches 64 128 256 512 1024]

Per model (3x32x32 images, Adam, fp32) and batch:
- measured: max_memory_allocated over three training steps beyond the model, its gradients and
  the optimizer's state, with cuDNN on and off, after a warm-up step (the first backward's one-off
  allocations are no step's); on - off is what cuDNN's choices add;
- predicted: the plan's fake step (fake_step.tracked_fake_step) and each convolution run alone
  on this GPU at its shape in the step (workspaces.above_step_peak_mb): how far the workspaces lift
  the step's peak; the largest single workspace beside it.
And once, first: what cuBLAS keeps for the whole process (workspaces.blas_workspaces_mb), which
both steps above hold already.

Needs a GPU (exits 77 without one).
"""

from __future__ import annotations

import argparse
import json
import sys

from dpstudy.data.task import Task


def step_excess_mb(model, optimizer, shape, batch: int, cudnn: bool) -> float:
    import torch
    import torch.nn.functional as F

    torch.backends.cudnn.enabled = cudnn
    x = torch.randn(batch, *shape, device="cuda")
    y = torch.randint(0, 10, (batch,), device="cuda")
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    for _ in range(3):
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    torch.cuda.synchronize()
    optimizer.zero_grad(set_to_none=True)
    torch.backends.cudnn.enabled = True
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def predicted_mb(name: str, shape, batch: int) -> tuple[float, float]:
    """(the plan's lift of the step's peak by cuDNN's workspaces, the largest workspace) in MB."""
    import torch

    from dpstudy.study.spec import complete
    from dpstudy.workflow import fake_step, workspaces

    spec = complete({"dataset": "synthetic_rgb", "model": name, "mode": "single", "batch": batch, "device": "cuda"})
    parts, _, convs = fake_step.tracked_fake_step(spec, Task.image(shape[0], shape[1], 10), batch)
    seen = []

    def measure(conv, device, amp_dtype):
        seen.append(workspaces.workspace_mb(conv, device, amp_dtype))
        return seen[-1]

    lift = workspaces.above_step_peak_mb(convs, parts["peak"], torch.device("cuda", 0), None, measure)
    return lift, max(max(pair) for pair in seen)


def measure(name: str, batches: list[int]) -> list[dict]:
    import torch

    from dpstudy import models

    shape = (3, 32, 32)
    torch.manual_seed(0)
    model = models.build(name, Task.image(shape[0], shape[1], 10)).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    step_excess_mb(model, optimizer, shape, min(batches), cudnn=True)  # warm-up
    rows = []
    for batch in batches:
        on = step_excess_mb(model, optimizer, shape, batch, cudnn=True)
        off = step_excess_mb(model, optimizer, shape, batch, cudnn=False)
        lift, largest = predicted_mb(name, shape, batch)
        rows.append(
            {
                "model": name,
                "batch": batch,
                "on_mb": on,
                "off_mb": off,
                "adds_mb": on - off,
                "lift_mb": lift,
                "largest_mb": largest,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["simplecnn", "resnet18"])
    parser.add_argument("--batches", nargs="+", type=int, default=[64, 128, 256, 512, 1024])
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("cuda_workspace: no CUDA device", file=sys.stderr)
        return 77
    from dpstudy.workflow.workspaces import blas_workspaces_mb

    blas = blas_workspaces_mb(torch.device("cuda", 0))  # first: before any other matrix product here
    rows = [row for name in args.models for row in measure(name, args.batches)]
    head = f"{'model':10} {'batch':>5} {'step on':>8} {'off':>8} {'cuDNN adds':>10} {'predicted':>9} {'largest ws':>10}"
    print(f"\n{head} (MB)")
    for r in rows:
        print(
            f"{r['model']:10} {r['batch']:5d} {r['on_mb']:8.1f} {r['off_mb']:8.1f} {r['adds_mb']:10.1f} "
            f"{r['lift_mb']:9.1f} {r['largest_mb']:10.1f}"
        )
    worst = max(abs(r["lift_mb"] - r["adds_mb"]) for r in rows)
    print(f"largest |predicted - measured|: {worst:.1f} MB")
    print(f"cuBLAS's workspaces, kept by the process from its first matrix product: {blas:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
