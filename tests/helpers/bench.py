"""What every kernel benchmark table holds, --quick or full (tests/unit/microbench/test_bench.py's
in-process run, the default study's scripts/kernel_bench.py)."""

from __future__ import annotations

import pandas as pd
import torch

from dpstudy.microbench import kernels


def assert_kernel_rows(df: pd.DataFrame) -> None:
    assert list(df.columns) == kernels.COLUMNS
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
    if not torch.cuda.is_available():
        assert (cuda.reason == "no CUDA device").all() and cuda.median_s.isna().all()
