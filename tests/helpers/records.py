"""A factory of realistic fake records (valid against dpstudy.record.fields.RECORD_SCHEMA).

Every number is derived from a few arguments so that tests can assert exact values:
an epoch processes `SAMPLES` samples at `samples_per_s`, evaluation takes `EVAL_S`, and a
cell's total time is startup + epochs + `TEARDOWN_S`, so its overhead is STARTUP_S + TEARDOWN_S.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from dpstudy.record import fields as record
from dpstudy.record.fields import BUDGET_MARK
from dpstudy.study import schema
from helpers import REPO

CURRENT = {"git_commit": "cafe00000000", "source_hash": "current00000"}
OLD = {"git_commit": "0ld000000000", "source_hash": "old000000000"}
SAMPLES = 6000
EVAL_S = 0.5
STARTUP_S = 2.0
TEARDOWN_S = 1.0
DP_REASON = "dp needs CUDA: no GPU is visible"
NCCL_REASON = "nccl needs CUDA: no GPU is visible"
OOM_REASON = "rank 0: OutOfMemoryError: can't allocate memory (at train.py:88)"


def make_spec(**keys: Any) -> dict[str, Any]:
    """A complete spec: the schema's defaults, synthetic/lenet, two epochs, then `keys`."""
    spec = {
        **schema.defaults("spec"),
        "dataset": "synthetic",
        "model": "lenet",
        "mode": "single",
        "epochs": 2,
        "device": "cpu",
    }
    spec.update(keys)
    return dict(sorted(spec.items()))


def cell_id(spec: dict[str, Any], suffix: str = "") -> str:
    """The cell id (docs/design.md, Cells); `suffix` carries what the grid varies beyond the grid keys (e.g. -r1)."""
    nodes = f"-nodes{spec['nodes']}" if spec["nodes"] > 1 else ""
    return (
        f"{spec['dataset']}-{spec['model']}-{spec['mode']}-g{spec['gpus']}-b{spec['batch']}-{spec['backend']}"
        f"{nodes}{suffix}"
    )


HOST_TORCH = "/opt/torch/.venv/lib/python3.12/site-packages"


def make_env(spec: dict[str, Any], code: dict[str, Any], device: str) -> dict[str, Any]:
    """A host `testhost`, run locally; a multi-node cell's ranks on SLURM nodes n1, n2, ..."""
    gpus = ["Fake GPU"] * 8 if device == "cuda" else []
    world = spec["gpus"] * spec["nodes"] if spec["mode"] in ("ddp", "fsdp") else 1
    ranks = [
        {
            "rank": r,
            "local_rank": r % spec["gpus"],
            "hostname": "testhost",
            "node": f"n{r // spec['gpus'] + 1}" if spec["nodes"] > 1 else "testhost",
        }
        for r in range(world)
    ]
    job = (
        {"scheduler": "slurm", "job_id": "7", "cuda_visible_devices": "0"}
        if spec["nodes"] > 1
        else {"scheduler": "local", "job_id": None, "cuda_visible_devices": None}
    )
    # GPU records as from a container's PyTorch (make setup TORCH=system), CPU ones from dpstudy's venv
    origin = (
        {"torch_provider": "host", "torch_path": HOST_TORCH}
        if device == "cuda"
        else {"torch_provider": "venv", "torch_path": "/work/dpstudy/.venv/lib/python3.11/site-packages"}
    )
    return {
        "torch": "2.14.1",
        **origin,
        "cuda": "13.0" if device == "cuda" else None,
        "cudnn": None,
        "nccl": None,
        "python": "3.11.2",
        "hostname": "testhost",
        "cpu": "Test CPU 9000",
        "gpus": gpus,
        "driver": None,
        "world_size": world,
        "nodes": spec["nodes"],
        "device": device,
        "threads_per_process": 1,
        "code_version": dict(code),
        "ranks": ranks,
        "job": job,
    }


def make_epochs(
    spec: dict[str, Any], samples_per_s: float, accs: list[float], wait_frac: float, peak_mem: list[float]
) -> list[dict[str, Any]]:
    epochs = []
    for i, acc in enumerate(accs, start=1):
        wall = SAMPLES / samples_per_s
        epochs.append(
            {
                "epoch": i,
                "train_loss": 2.0 / i,
                "train_acc": acc - 0.01,
                "test_loss": 1.5 / i,
                "test_acc": acc,
                "wall_s": wall,
                "eval_s": EVAL_S,
                "data_wait_s": wall * wait_frac,
                "compute_s": wall * (1 - wait_frac),
                "samples": SAMPLES,
                "samples_per_s": samples_per_s,
                "peak_mem_mb": list(peak_mem),
            }
        )
    return epochs


def make_record(
    status: str = "ok",
    *,
    samples_per_s: float = 1000.0,
    accs: tuple = (0.6, 0.9),
    wait_frac: float = 0.1,
    peak_mem: list[float] | None = None,
    reason: str | None = None,
    code: dict | None = None,
    device: str = "cpu",
    util: dict | None = None,
    probe: dict | None = None,
    memory: list[tuple[float, float, float, float]] | None = None,
    suffix: str = "",
    **spec_keys: Any,
) -> dict[str, Any]:
    """One record. ok: every epoch at `samples_per_s`; oom: the first epoch only; skipped: no epochs.
    `memory`: per device (parameters, gradients, optimizer state, activations) in MB, the tracker's
    split of one step (the peak is their sum)."""
    spec = make_spec(**spec_keys)
    peak_mem = peak_mem if peak_mem is not None else [100.0 + spec["batch"] / 64] * spec["gpus"] * spec["nodes"]
    accs = list(accs)[: 1 if status == "oom" else spec["epochs"]]
    epochs = [] if status == "skipped" else make_epochs(spec, samples_per_s, accs, wait_frac, peak_mem)
    summary = record.empty_summary()
    if epochs:
        steady = epochs[1:] or epochs
        summary.update(
            final_test_acc=epochs[-1]["test_acc"],
            median_epoch_s=steady[0]["wall_s"],
            samples_per_s=samples_per_s,
            startup_s=STARTUP_S,
            total_s=STARTUP_S + sum(e["wall_s"] + e["eval_s"] for e in epochs) + TEARDOWN_S,
        )
    rec = {
        "schema": record.SCHEMA_ID,
        "cell": cell_id(spec, suffix),
        "status": status,
        "reason": reason,
        "spec": spec,
        "env": make_env(spec, code or CURRENT, device),
        "epochs": epochs,
        "summary": summary,
        "util": util,
        "probe": probe,
    }
    if memory is not None:
        parts = dict(zip(record.MEMORY_PARTS, zip(*memory)))
        rec["memory"] = {**{k: list(v) for k, v in parts.items()}, "peak_mb": [sum(device) for device in memory]}
    record.validate(rec)
    return rec


def make_util(devices: int, busy: list[float]) -> dict[str, list[dict[str, float]]]:
    """Samples every 0.5 s for 3 s per device; device i is `busy[i]` % busy."""
    return {
        str(d): [{"t": 0.5 * k, "gpu_util": busy[d], "mem_util": busy[d] / 2, "mem_mb": 500.0 + d} for k in range(1, 7)]
        for d in range(devices)
    }


def small_grid() -> list[dict[str, Any]]:
    """CPU study: single g1 b64/b256, ddp gloo g2 b64/b256, dp and nccl skipped, one oom, one stale.

    Throughputs make the speedups exact: 1500/1000 = 1.5 (75 %) and 3400/2000 = 1.7 (85 %).
    """
    return [
        make_record(mode="single", batch=64, samples_per_s=1000.0, accs=(0.6, 0.90), wait_frac=0.02),
        make_record(mode="single", batch=256, samples_per_s=2000.0, accs=(0.6, 0.88), wait_frac=0.02, code=OLD),
        make_record(
            mode="ddp",
            gpus=2,
            batch=64,
            backend="gloo",
            samples_per_s=1500.0,
            accs=(0.6, 0.895),
            wait_frac=0.05,
            peak_mem=[120.0, 119.0],
        ),
        make_record(
            mode="ddp",
            gpus=2,
            batch=256,
            backend="gloo",
            samples_per_s=3400.0,
            accs=(0.6, 0.872),
            wait_frac=0.05,
            peak_mem=[140.0, 140.0],
        ),
        make_record("skipped", mode="dp", gpus=2, batch=64, reason=DP_REASON),
        make_record("skipped", mode="ddp", gpus=2, batch=64, backend="nccl", reason=NCCL_REASON),
        make_record("oom", mode="ddp", gpus=2, batch=1024, backend="gloo", samples_per_s=500.0, reason=OOM_REASON),
    ]


STRATEGY_DDP_PROBE = {"sync_step_s": 0.012, "nosync_step_s": 0.010, "allreduce_s": 0.004, "grad_bytes": 4.0e5}
# FSDP's probe: a step as FSDP runs it and on an unsharded replica, 4 units
STRATEGY_FSDP_PROBE = {
    "sync_step_s": 0.014,
    "nosync_step_s": 0.010,
    "allgather_s": 0.002,
    "reduce_scatter_s": 0.002,
    "gather_bytes": 4.0e5,
    "grad_bytes": 4.0e5,
    "units": 4,
}
# per device: parameters, gradients, optimizer state, activations (MB)
ONE_DEVICE = (10.0, 10.0, 20.0, 60.0)
REPLICA = (10.0, 10.0, 20.0, 30.0)
SHARD = (5.0, 5.0, 10.0, 30.0)
BUDGET_REASON = f"predicted 93.10 GiB > 70 GiB per device {BUDGET_MARK}"


def repeats(speeds: list[float], suffix: str = "", **keys: Any) -> list[dict[str, Any]]:
    """One record per throughput, repeats 0, 1, ... of one setting."""
    return [make_record(samples_per_s=s, repeat=k, suffix=f"{suffix}-r{k}", **keys) for k, s in enumerate(speeds)]


def strategy_grid() -> list[dict[str, Any]]:
    """synthetic/lenet at batch 64: one device (eager and compiled), DDP, FSDP full and grad_op over
    Gloo; NCCL skipped (no GPU), FSDP at batch 64 per device skipped by the memory plan (its
    record written by the launcher: no device kind), and batch 1024 out of memory."""
    ddp = {"mode": "ddp", "gpus": 2, "backend": "gloo", "probe": STRATEGY_DDP_PROBE, "memory": [REPLICA] * 2}
    fsdp = {"mode": "fsdp", "gpus": 2, "backend": "gloo", "memory": [SHARD, (5.0, 5.0, 10.0, 20.0)]}
    fsdp["probe"] = STRATEGY_FSDP_PROBE
    skipped_by_plan = make_record(
        "skipped",
        mode="fsdp",
        shard="full",
        gpus=2,
        backend="gloo",
        batch_scope="per_device",
        batch=32,
        reason=BUDGET_REASON,
    )
    del skipped_by_plan["env"]["device"]  # the launcher's record: no rank ran
    return [
        *repeats([1000.0, 1040.0, 960.0], mode="single", memory=[ONE_DEVICE]),
        *repeats([1100.0], suffix="-compileTrue", mode="single", compile=True, memory=[ONE_DEVICE]),
        *repeats([1500.0, 1530.0, 1470.0], **ddp),
        *repeats([1490.0, 1520.0, 1460.0], suffix="-shardgrad_op", shard="grad_op", **fsdp),
        *repeats([1200.0, 1210.0, 1190.0], suffix="-shardfull", shard="full", **fsdp),
        make_record("skipped", mode="ddp", gpus=2, backend="nccl", reason=NCCL_REASON),
        skipped_by_plan,
        make_record("oom", mode="ddp", gpus=2, batch=1024, backend="gloo", reason=OOM_REASON),
    ]


def strategy_plan(records: list[dict[str, Any]]) -> pd.DataFrame:
    """A memory plan of strategy_grid's finished cells: 10 % above each device's measured peak."""
    rows = [
        {"cell": rec["cell"], "device": device, "peak_mb": peak * 1.1, "reason": None}
        for rec in records
        if rec.get("memory")
        for device, peak in enumerate(rec["memory"]["peak_mb"])
    ]
    return pd.DataFrame(rows)


def write_records(directory: str | Path, records: list[dict[str, Any]]) -> list[Path]:
    """results/cells/{cell}/record.json under `directory`, in the given order."""
    paths = []
    for rec in records:
        path = Path(directory) / "cells" / rec["cell"] / "record.json"
        record.write(path, rec)
        paths.append(path)
    return paths


def run_report(root: Path, study: str) -> None:
    """scripts/report.py (papermill, a real kernel) on root/tables, figures, bench and study.yaml,
    writing root/report/report.ipynb and report.html."""
    import subprocess
    import sys

    folders = ("tables", "figures", "bench")
    subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "report.py"),
            "--notebook",
            str(REPO / "notebooks" / "report.ipynb"),
            "--out-dir",
            "report",
            "--study",
            study,
            "--config",
            "study.yaml",
            *(arg for folder in folders for arg in (f"--{folder}", folder)),
        ],
        cwd=root,
        check=True,
        capture_output=True,
    )


def render_report(root: Path, records: list[dict[str, Any]], study: str, config_text: str | None = None) -> Path:
    """Records -> tables -> scripts/report.py (papermill, a real kernel) under `root`, without
    figures or benchmarks (their sections say so); returns report.html."""

    from dpstudy.analysis import collect, tablefiles

    tables = collect.summarise(collect.collect(write_records(root, records), CURRENT))
    tablefiles.write_tables(tables, root / "tables")
    for folder in ("figures", "bench"):
        (root / folder).mkdir()
    (root / "study.yaml").write_text(config_text or f"study: {study}\n")
    run_report(root, study)
    return root / "report" / "report.html"


def cells_frame(rows: list[tuple[str, int, float]]) -> pd.DataFrame:
    """Minimal cells: (mode, gpus, samples_per_s) at one batch, one repeat index each."""
    from dpstudy.analysis.keys import SPEC_DEFAULTS, SPEC_KEYS, column_value

    out = []
    for i, (mode, gpus, speed) in enumerate(rows):
        spec = {k: column_value(SPEC_DEFAULTS.get(k)) for k in SPEC_KEYS}
        spec.update(
            dataset="synthetic",
            model="lenet",
            mode=mode,
            gpus=gpus,
            nodes=1,
            batch=64,
            backend="gloo" if mode == "ddp" else "none",
            repeat=i,
            lr=0.01,
        )
        out.append(
            {
                "cell": f"{mode}-g{gpus}-r{i}",
                **spec,
                "status": "ok",
                "samples_per_s": speed,
                "final_test_acc": 0.9,
                "devices": gpus,
                "env_device": "cpu",
                "global_batch": 64,
            }
        )
    return pd.DataFrame(out).astype({"devices": "Int64", "gpus": "Int64", "nodes": "Int64"})


def comm_fit(latency_s: float, bandwidth_gbps: float, collective: str = "all_reduce", world_size: int = 2) -> dict:
    """One comm_fit.csv row (dpstudy.analysis.comm_fit) of Gloo on the CPU: latency + bytes / bandwidth."""
    return {
        "collective": collective,
        "backend": "gloo",
        "device": "cpu",
        "world_size": world_size,
        "points": 9,
        "min_bytes": 4096,
        "max_bytes": 256 << 20,
        "latency_s": latency_s,
        "bandwidth_gbps": bandwidth_gbps,
        "rel_rmse": 0.02,
        "max_rel_error": 0.04,
    }


def comm_bench(latency_s: float = 1e-4, bandwidth_gbps: float = 0.5) -> pd.DataFrame:
    """comm_bench's rows (dpstudy.microbench.comm) of Gloo on the CPU between 2 ranks: every
    collective at four sizes, latency + bytes / bandwidth each (what comm_fit then fits exactly)."""
    sizes = [4096, 65536, 1 << 20, 16 << 20]
    rows = [
        {
            "collective": collective,
            "backend": "gloo",
            "device": "cpu",
            "world_size": 2,
            "bytes": size,
            "median_s": latency_s + size / (bandwidth_gbps * 1e9),
            "stream_s": latency_s + size / (bandwidth_gbps * 1e9),
            "reason": None,
        }
        for collective in ("all_reduce", "all_gather", "reduce_scatter")
        for size in sizes
    ]
    return pd.DataFrame(rows)


# DDP's probe of ddp_pair: a step with its all-reduce 45 ms, without 35 ms (10 ms exposed), the
# all-reduce alone 20 ms, LeNet's 4e5 bytes of gradients
DDP_PAIR_PROBE = {"steps": 8, "sync_step_s": 0.045, "nosync_step_s": 0.035, "allreduce_s": 0.020, "grad_bytes": 400_000}


def ddp_pair() -> list[dict[str, Any]]:
    """One device at batch 64 (1,000 samples/s: a 64 ms step, 2 % waiting for data) and DDP over Gloo
    on 2 ranks at the same global batch (1,500/s: a 42.7 ms step, 5 % waiting) with DDP_PAIR_PROBE:
    the step model's parts of it are known exactly (tests/unit/analysis/test_scaling.py)."""
    return [
        make_record(mode="single", samples_per_s=1000.0, wait_frac=0.02),
        make_record(mode="ddp", gpus=2, backend="gloo", samples_per_s=1500.0, wait_frac=0.05, probe=DDP_PAIR_PROBE),
    ]
