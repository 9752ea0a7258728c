"""The price of a scheduler: the same study locally and through a private SLURM (profiles/slurm).

    .venv/bin/python benchmarks/cluster.py [--epochs 2] [--train-size 2048]

Starts the private two-node SLURM of the cluster tests (tests/helpers/slurm_cluster.py; needs root and
Debian's SLURM), runs the one-node cells of the quickstart grid (single, DDP g1 and g2 over Gloo,
DP skipped) once with `snakemake --cores 2` and once with `--profile profiles/slurm`, and prints
wall times and, per SLURM job, where its time went: queueing (submit to start), the job's own
start-up and tear-down around the training process (start to end minus the record's total_s),
and what Snakemake's status polling adds on top (the run's wall time minus the jobs' span).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from helpers.slurm_cluster import SlurmCluster, unavailable  # noqa: E402
from helpers.workflow import copy_checkout, snakemake  # noqa: E402

from dpstudy.record import fields as record  # noqa: E402


def study(epochs: int, train_size: int) -> dict:
    return {
        "study": "cluster_bench",
        "request_gpus": "always",
        "datasets": {"synthetic": {"train_size": train_size, "test_size": train_size // 4}},
        "defaults": {"epochs": epochs},
        "bench": {"kernels": False, "comm": False},
        "resources": {"mem_mb_per_process": 1500, "runtime_min": 30},
        "sweeps": [
            {
                "name": "modes",
                "dataset": "synthetic",
                "model": "lenet",
                "grid": {"mode": ["single", "dp", "ddp"], "gpus": [1, 2], "batch": [64], "backend": ["gloo"]},
            }
        ],
    }


def timed(workdir: Path, *args: str, config: dict, env: dict | None = None) -> float:
    started = time.monotonic()
    snakemake(workdir, *args, config=config, env=env, timeout=3600)
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--train-size", type=int, default=2048)
    args = parser.parse_args()
    why = unavailable()
    if why:
        sys.exit(f"cannot run: {why}")
    config = study(args.epochs, args.train_size)
    with tempfile.TemporaryDirectory() as tmp:
        local = copy_checkout(Path(tmp) / "local")
        local_s = timed(local, "--cores", "2", "--resources", "gpu=2", config=config)
        cluster = SlurmCluster().start()
        try:
            remote = copy_checkout(Path(tmp) / "slurm")
            slurm_s = timed(
                remote,
                "--profile",
                "profiles/slurm",
                "--slurm-status-command",
                "squeue",
                config=config,
                env=cluster.env,
            )
            jobs = cluster.sacct()
        finally:
            cluster.stop()
        rows = []
        for path in sorted((remote / "results/cells").glob("*/record.json")):
            rec = record.read(path)
            job = jobs[rec["env"]["job"]["job_id"]]
            submit, start, end = (datetime.fromisoformat(job[k]) for k in ("Submit", "Start", "End"))
            rows.append(
                (
                    rec["cell"],
                    (start - submit).total_seconds(),
                    (end - start).total_seconds() - rec["summary"]["total_s"],
                    rec["summary"]["total_s"],
                    submit,
                    end,
                )
            )
    span = (max(r[5] for r in rows) - min(r[4] for r in rows)).total_seconds()
    print(f"{len(rows)} cells, {args.epochs} epochs, {args.train_size} training samples, 2 cores")
    print(f"local (snakemake --cores 2):            {local_s:6.1f} s")
    print(f"SLURM (snakemake --profile profiles/slurm): {slurm_s:6.1f} s  ({slurm_s / local_s:.2f}x local)")
    print(f"  first submission to last job end:       {span:6.1f} s")
    print(f"{'cell':40} {'queued s':>9} {'job start-up+tear-down s':>25} {'training process s':>19}")
    for cell, queued, around, total, *_ in rows:
        print(f"{cell:40} {queued:9.1f} {around:25.1f} {total:19.1f}")
    print(
        f"median per job: queued {statistics.median(r[1] for r in rows):.1f} s, start-up and tear-down in the "
        f"job {statistics.median(r[2] for r in rows):.1f} s (SLURM's times have 1 s resolution)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
