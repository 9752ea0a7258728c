"""gpu-check's `zero` item (dpstudy.gpucheck.zero) without a GPU: its figures from made-up
measurements, and the whole measurement on the CPU at a tiny size, FSDP and ZeRO-2 and 3 each on a
process group of one Gloo rank, one after another in one process, as the item runs them on a GPU:
a process of its own, as gpu-check's worker gives it (ZeRO-3 patches torch's functions for the
process: a later FLOP count in the same process would count its linear layers otherwise)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import REPO

from dpstudy.gpucheck import registry, summary, zero, zero_figures

ITEM = registry.BY_NAME["zero"]
H100 = "NVIDIA H100 80GB HBM3"


def row(tokens_per_s: float, predicted: float, allocated: float) -> dict:
    return {
        "throughput": {"tokens_per_s": tokens_per_s},
        "predicted": {"allocated_mb": predicted},
        "measured": {"allocated_mb": allocated},
        "errors": [],
    }


def test_figures_compare_each_strategy_with_fsdp_and_its_plan_with_the_allocator():
    made = {
        "device_name": H100,
        "params": 124_000_000,
        "flops_per_token": 854e6,
        "fsdp": row(400_000.0, 20_000.0, 20_500.0),
        "zero2": row(380_000.0, 23_000.0, 22_000.0),
        "zero3": {"errors": ["throughput: OutOfMemoryError: CUDA out of memory"], "predicted": {"allocated_mb": 1.0}},
    }
    result = zero_figures.zero_result(made, zero.zero_spec("deepspeed", "zero3", device="cpu"))
    figures = result["figures"]
    assert figures["zero2_vs_fsdp"] == pytest.approx(0.95) and "zero3_vs_fsdp" not in figures
    assert figures["fsdp_memory_error"] == pytest.approx(500 / 20_500)
    assert figures["zero2_memory_error"] == pytest.approx(1_000 / 22_000)
    assert figures["fsdp_mfu"] == pytest.approx(400_000 * 854e6 / 989.5e12, rel=1e-3)  # the H100's dense BF16 peak
    assert result["details"]["zero3_tokens_per_s"] == "not measured: throughput: OutOfMemoryError: CUDA out of memory"
    # ZeRO-3 has no figures, so its plan target is missed: the item fails, naming why
    verdict = summary.evaluate(ITEM, {"status": "ok", **json.loads(json.dumps(result))})
    assert verdict.verdict == "FAIL"


MEASURE = """
import json, os, sys
from dpstudy.gpucheck import zero
made = zero.measure("cpu", min_steady_s=0.0, **json.loads(sys.argv[1]))
print(json.dumps(made), flush=True)
os._exit(0)
"""


@pytest.mark.slow
def test_the_item_measures_on_the_cpu_at_a_tiny_size():
    settings = {"model_args": {"size": "tiny"}, "seq_len": 32, "batch": 4, "warmup_steps": 2, "precision": "fp32"}
    settings |= {"reduce_bucket_size": 100_000}
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT")}
    proc = subprocess.run(
        [sys.executable, "-c", MEASURE, json.dumps(settings)], capture_output=True, text=True, cwd=REPO, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    made = json.loads(proc.stdout.strip().splitlines()[-1])
    for name in zero_figures.SCHEMES:
        assert made[name]["errors"] == [], (name, made[name]["errors"])
        tp = made[name]["throughput"]
        assert tp["steady_steps"] == 2 and tp["tokens_per_s"] > 0 and tp["loss_finite"], (name, tp)
        # one rank: nothing sharded, but ZeRO's fp32 master beside the optimizer's state; on a CPU
        # the plan's step against the tracker's (no allocator)
        predicted, measured = made[name]["predicted"], made[name]["measured"]
        assert predicted["peak_mb"] == pytest.approx(measured["peak_mb"], rel=0.15), (name, predicted, measured)
    fsdp, zero2 = made["fsdp"]["measured"], made["zero2"]["measured"]
    assert zero2["optimizer_mb"] == pytest.approx(fsdp["optimizer_mb"] * 1.5, rel=0.02)  # Adam's + the master
    result = zero_figures.zero_result(made, zero.zero_spec("deepspeed", "zero3", device="cpu", **settings))
    assert {"fsdp_tokens_per_s", "zero2_vs_fsdp", "zero3_vs_fsdp"} <= set(result["figures"])
    assert result["figures"]["zero3_mfu"] is None  # no peak for a CPU
