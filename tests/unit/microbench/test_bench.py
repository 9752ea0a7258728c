"""Benchmark smoke tests: the CLIs run with --quick and write the promised tables and figures.
No timing is asserted; only that every row is there and the ratios are computed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from helpers import REPO

import dpstudy.ext
from dpstudy.ext import reference
from dpstudy.microbench import comm, kernels
from dpstudy.microbench.loops import max_pool2d_backward_loop, rgb_to_grayscale_loop

EXT_TEST_DIR = REPO / "results" / "ext-test"  # the build test_ext.py uses
CUDA = torch.cuda.is_available()


def _run(*args: str) -> None:
    subprocess.run([sys.executable, *args], cwd=REPO, check=True)


@pytest.fixture(scope="module")
def ext_dir() -> Path:
    dpstudy.ext.build(EXT_TEST_DIR, cpu_only=not CUDA)  # reused when up to date
    return EXT_TEST_DIR


def test_loops_compute_what_the_operators_compute():
    image = torch.randint(0, 256, (3, 6, 5), dtype=torch.uint8)
    assert torch.equal(rgb_to_grayscale_loop(image, rows=3)[:, :3], reference.rgb_to_grayscale(image)[:, :3])
    x = torch.randn(2, 3, 6, 8, requires_grad=True)
    out = F.max_pool2d(x, 2)
    grad = torch.randn_like(out)
    (expected,) = torch.autograd.grad(out, x, grad)
    got = max_pool2d_backward_loop(grad, x.detach(), 2, 2, planes=4)
    torch.testing.assert_close(got.view(6, 6, 8)[:4], expected.view(6, 6, 8)[:4])
    assert not got.view(6, 6, 8)[4:].any()


def test_speedups_compare_within_op_and_shape():
    df = pd.DataFrame(
        {
            "op": ["a", "a", "a", "b"],
            "shape": ["s"] * 4,
            "impl": ["python_loop", "pytorch", "extension", "extension"],
            "device": ["cpu"] * 4,
            "median_s": [10.0, 0.5, 0.1, 1.0],
        }
    )
    out = kernels.add_speedups(df.reindex(columns=kernels.COLUMNS[:-2]))
    np.testing.assert_allclose(out.speedup_vs_loop[:3], [1, 20, 100])
    np.testing.assert_allclose(out.speedup_vs_pytorch[:3], [0.05, 1, 5])
    assert out.speedup_vs_loop.isna()[3]


def test_kernel_bench_quick(ext_dir, tmp_path):
    csv, png = tmp_path / "kernels.csv", tmp_path / "kernels.png"
    _run("scripts/kernel_bench.py", "--out", str(csv), "--quick", "--ext", str(ext_dir), "--png", str(png))
    df = pd.read_csv(csv)
    assert list(df.columns) == kernels.COLUMNS and png.stat().st_size > 0
    ran = df[df.reason.isna()]
    assert set(ran.op) == {"rgb_to_grayscale", "max_pool2d_backward", "conv2d_forward", "conv2d_backward"}
    assert (ran.median_s > 0).all() and (ran.threads >= 1).all()
    loops = ran[ran.impl == "python_loop"]
    assert len(loops) == 3 and loops.extrapolated.all() and loops.note.str.contains("scaled").all()
    assert (loops.speedup_vs_loop == 1).all()
    ext = ran[(ran.impl == "extension") & ran.op.isin(["rgb_to_grayscale", "max_pool2d_backward"])]
    assert len(ext) == 3 and (ext.speedup_vs_loop > 0).all() and (ext.speedup_vs_pytorch > 0).all()
    cuda = df[df.device == "cuda"]
    assert len(cuda) == len(ran[ran.impl != "python_loop"])
    if not CUDA:
        assert (cuda.reason == "no CUDA device").all() and cuda.median_s.isna().all()


def test_comm_bench_quick(tmp_path):
    csv, png = tmp_path / "comm.csv", tmp_path / "comm.png"
    _run("scripts/comm_bench.py", "--out", str(csv), "--quick", "--png", str(png))
    df = pd.read_csv(csv)
    assert list(df.columns) == comm.COLUMNS and png.stat().st_size > 0
    gloo = df[(df.backend == "gloo") & (df.device == "cpu")]
    assert list(gloo.bytes) == [4096 * 4**k for k in range(6)] and gloo.reason.isna().all()
    np.testing.assert_allclose(gloo.algbw_gbps, gloo.bytes / gloo.median_s / 1e9)
    np.testing.assert_allclose(gloo.busbw_gbps, gloo.algbw_gbps * 2 * (2 - 1) / 2)
    assert set(zip(df.backend, df.device)) == set(comm.COMBOS)
    skipped = df[df.reason.notna()]
    assert skipped.median_s.isna().all() and skipped.busbw_gbps.isna().all()
    if torch.cuda.device_count() < 2:
        assert (skipped.backend == "nccl").any()


def test_comm_helpers():
    assert comm.size_label(4096) == "4 KiB" and comm.size_label(256 << 20) == "256 MiB"
    if torch.cuda.device_count() < 2:
        assert "GPU" in comm.reason("nccl", "cuda", 2) or "CUDA" in comm.reason("nccl", "cuda", 2)
    assert comm.reason("gloo", "cpu", 2) is None
