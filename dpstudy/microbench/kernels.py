"""Kernel microbenchmark: the extension against the sources' Python loops and PyTorch's own ops.

Every row is one (op, shape, impl, device) timed with torch.utils.benchmark (warm-up, CUDA
synchronised, median and IQR over blocks). Python loops run on a subset and are scaled to the
full shape; such rows say so (`extrapolated`, `note`). Rows that cannot run here are kept with a
`reason` and no figures.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from types import ModuleType

import pandas as pd
import torch
import torch.nn.functional as F
from torch.utils.benchmark import Timer

from dpstudy.ext import reference

from .loops import max_pool2d_backward_loop, rgb_to_grayscale_loop

COLUMNS = [
    "op",
    "shape",
    "impl",
    "device",
    "threads",
    "median_s",
    "iqr_s",
    "runs",
    "extrapolated",
    "note",
    "reason",
    "speedup_vs_loop",
    "speedup_vs_pytorch",
]
GRAY_SHAPE = (200, 3, 128, 128)  # source 004: 200 STL-10 images resized to 128x128
POOL_SHAPES = ((64, 6, 28, 28), (64, 16, 14, 14))  # LeNet's two pools on MNIST, batch 64 (source 002)
CONV_SHAPES = (((64, 3, 32, 32), (6, 3, 3, 3)), ((64, 6, 16, 16), (16, 6, 3, 3)))  # LeNet's convs on CIFAR-10


@dataclass
class Case:
    op: str
    shape: str
    impl: str
    device: str
    fn: Callable[[], object] | None = None
    scale: float = 1.0  # full-shape time / timed time, for loops run on a subset
    note: str = ""
    reason: str | None = None


def _shape(*shapes: tuple[int, ...]) -> str:
    return " ".join("x".join(map(str, s)) for s in shapes)


def grayscale_cases(ops: ModuleType, device: str, quick: bool) -> list[Case]:
    from torchvision.transforms.v2.functional import rgb_to_grayscale as tv_gray

    images = torch.randint(0, 256, GRAY_SHAPE, dtype=torch.uint8, device=device)
    shape = _shape(GRAY_SHAPE)
    cases = [
        Case(
            "rgb_to_grayscale",
            shape,
            "pytorch",
            device,
            lambda: reference.rgb_to_grayscale(images),
            note="dpstudy.ext.reference: int32 weighted sum, same rounding",
        ),
        Case(
            "rgb_to_grayscale",
            shape,
            "torchvision",
            device,
            lambda: tv_gray(images),
            note="torchvision.transforms.v2.functional.rgb_to_grayscale (float weights, truncates)",
        ),
        Case("rgb_to_grayscale", shape, "extension", device, lambda: ops.rgb_to_grayscale(images)),
    ]
    if device == "cpu":
        rows = 2 if quick else 16
        first = images[0].clone()
        pixels = GRAY_SHAPE[0] * GRAY_SHAPE[2] * GRAY_SHAPE[3]
        timed = rows * GRAY_SHAPE[3]
        cases.insert(
            0,
            Case(
                "rgb_to_grayscale",
                shape,
                "python_loop",
                device,
                lambda: rgb_to_grayscale_loop(first, rows),
                pixels / timed,
                f"source 004 double loop; timed {timed} of {pixels} pixels, scaled linearly",
            ),
        )
    return cases


def pool_cases(device: str, quick: bool) -> list[Case]:
    cases = []
    for shape in POOL_SHAPES:
        x = torch.randn(shape, device=device)
        out, indices = torch.ops.dpstudy.max_pool2d(x, [2, 2], [2, 2])
        grad = torch.randn_like(out)
        name = _shape(shape)
        cases += [
            Case(
                "max_pool2d_backward",
                name,
                "pytorch",
                device,
                lambda g=grad, x=x, i=indices: torch.ops.aten.max_pool2d_with_indices_backward(
                    g, x, [2, 2], [2, 2], [0, 0], [1, 1], False, i
                ),
            ),
            Case(
                "max_pool2d_backward",
                name,
                "extension",
                device,
                lambda g=grad, i=indices, hw=list(shape[2:]): torch.ops.dpstudy.max_pool2d_backward(g, i, hw),
            ),
        ]
        if device == "cpu":
            planes = 1 if quick else 4
            cases.insert(
                -2,
                Case(
                    "max_pool2d_backward",
                    name,
                    "python_loop",
                    device,
                    lambda g=grad, x=x, planes=planes: max_pool2d_backward_loop(g, x, 2, 2, planes),
                    shape[0] * shape[1] / planes,
                    f"source 002 for-loop; timed {planes} of {shape[0] * shape[1]} planes, scaled linearly",
                ),
            )
    return cases


def conv_cases(ops: ModuleType, device: str) -> list[Case]:
    cases = []
    for in_shape, w_shape in CONV_SHAPES:
        x, w, b = (torch.randn(s, device=device) for s in (in_shape, w_shape, w_shape[:1]))
        grad = torch.randn_like(F.conv2d(x, w, b, padding=1))
        name = _shape(in_shape, w_shape)
        cases += [
            Case("conv2d_forward", name, "pytorch", device, lambda x=x, w=w, b=b: F.conv2d(x, w, b, padding=1)),
            Case("conv2d_forward", name, "extension", device, lambda x=x, w=w, b=b: ops.conv2d(x, w, b, padding=1)),
            Case(
                "conv2d_backward",
                name,
                "pytorch",
                device,
                lambda g=grad, x=x, w=w: torch.ops.aten.convolution_backward(
                    g, x, w, [w.shape[0]], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, True]
                ),
            ),
            Case(
                "conv2d_backward",
                name,
                "extension",
                device,
                lambda g=grad, x=x, w=w: torch.ops.dpstudy.conv2d_backward(g, x, w, [1, 1], [1, 1]),
            ),
        ]
    return cases


def _cases(ops: ModuleType, device: str, quick: bool) -> list[Case]:
    return grayscale_cases(ops, device, quick) + pool_cases(device, quick) + conv_cases(ops, device)


def all_cases(ops: ModuleType, quick: bool) -> list[Case]:
    cases = _cases(ops, "cpu", quick)
    if not torch.cuda.is_available():
        # Kept, empty, so the table shows what was not measured and why ("meta" makes no data).
        return cases + [replace(c, device="cuda", fn=None, reason="no CUDA device") for c in _cases(ops, "meta", quick)]
    cuda = _cases(ops, "cuda", quick)
    if not torch._C._dispatch_has_kernel_for_dispatch_key("dpstudy::conv2d", "CUDA"):
        cuda = [
            replace(c, fn=None, reason="extension built without CUDA kernels") if c.impl == "extension" else c
            for c in cuda
        ]
    return cases + cuda


def measure(case: Case, min_run_time: float) -> dict:
    threads = torch.get_num_threads()
    row = {
        "op": case.op,
        "shape": case.shape,
        "impl": case.impl,
        "device": case.device,
        "threads": threads,
        "extrapolated": case.scale != 1.0,
        "note": case.note,
        "reason": case.reason,
    }
    if case.fn is None:
        return row
    # Timer synchronises CUDA around each block; blocked_autorange warms up before timing.
    m = Timer("fn()", globals={"fn": case.fn}, num_threads=threads).blocked_autorange(min_run_time=min_run_time)
    runs = len(m.times) * m.number_per_run
    return {**row, "median_s": m.median * case.scale, "iqr_s": m.iqr * case.scale, "runs": runs}


def add_speedups(df: pd.DataFrame) -> pd.DataFrame:
    """speedup_vs_loop: the Python loop's median over this row's, same op and shape (any device);
    speedup_vs_pytorch: PyTorch's median on the same device over this row's."""
    loop = df.loc[df.impl == "python_loop", ["op", "shape", "median_s"]].rename(columns={"median_s": "loop_s"})
    ref = df.loc[df.impl == "pytorch", ["op", "shape", "device", "median_s"]].rename(columns={"median_s": "pytorch_s"})
    out = df.merge(loop, on=["op", "shape"], how="left").merge(ref, on=["op", "shape", "device"], how="left")
    out["speedup_vs_loop"] = out.loop_s / out.median_s
    out["speedup_vs_pytorch"] = out.pytorch_s / out.median_s
    return out[COLUMNS]


def run(ops: ModuleType, quick: bool = False) -> pd.DataFrame:
    """Time every case; `ops` is dpstudy.ext.load()'s module."""
    rows = [measure(case, 0.05 if quick else 0.5) for case in all_cases(ops, quick)]
    df = pd.DataFrame(rows, columns=COLUMNS[:-2]).astype({"runs": "Int64"})
    return add_speedups(df)
