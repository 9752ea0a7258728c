"""Packs on a real SLURM (issue 52): a study of short cells packed and unpacked, and what a cell
costs inside a pack.

    .venv/bin/python benchmarks/packs.py [--cells 60] [--alone 12] [--parse-cells 10000]

Starts the private two-node SLURM of the cluster tests (tests/helpers/slurm_cluster.py; needs root
and Debian's SLURM) and runs, each on a fresh copy of the workflow, the train cells of a study of
`--cells` one-epoch LeNet cells (synthetic data, 128 samples):
1. packed into 6 jobs (cluster.minutes_per_job at a guessed minute per cell);
2. unpacked (minutes_per_job null): a SLURM job per cell;
3. `--alone` cells in one pack, nothing else running: the per-cell overhead inside a pack, split
   into the job step's start and its Snakemake's parse of the study, the cell's process up to its
   first epoch (imports, data, FLOP count: the record's startup_s), its training and the rest of
   its Snakemake job (benchmark.tsv).
Then times one job step's Snakemake parse of a `--parse-cells` study (benchmarks/plan.py's), which
every packed cell pays, and prints the machine's reference (tests/helpers/machine.py) beside it all.
The issue's target: at most 5 s of overhead per single-device cell (OVERHEAD_TARGET_S).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))

import plan as plan_benchmark  # noqa: E402
from helpers.machine import reference  # noqa: E402
from helpers.slurm_cluster import SlurmCluster, unavailable  # noqa: E402
from helpers.workflow import BIN, copy_checkout, planned, snakemake  # noqa: E402

from dpstudy.record import fields as record  # noqa: E402
from dpstudy.study import outputs  # noqa: E402

OVERHEAD_TARGET_S = 5.0
SLURM_ARGS = ("--profile", "profiles/slurm", "--slurm-status-command", "squeue")


def study(cells: int, minutes_per_job: float | None) -> dict:
    lrs = [round(0.01 * (i + 1), 3) for i in range(max(1, cells // 4))]  # 4 repeats of each
    return {
        "study": "packs_benchmark",
        "request_gpus": "always",
        "datasets": {"synthetic": {"train_size": 128, "test_size": 32}},
        "defaults": {"epochs": 1, "repeats": 4},
        "bench": {"kernels": False, "comm": False, "floor": False},
        "resources": {"mem_mb_per_process": 1500, "runtime_min": 2},
        "cluster": {"minutes_per_job": minutes_per_job, "cell_minutes": 1},
        "sweeps": [{"name": "s", "dataset": "synthetic", "model": "lenet", "grid": {"mode": ["single"], "lr": lrs}}],
    }


def cell_ids(workdir: Path, config: dict, env: dict) -> list[str]:
    return planned(snakemake(workdir, *SLURM_ARGS, "-n", config=config, env=env))["train"]


def run(root: Path, name: str, config: dict, cluster: SlurmCluster) -> dict:
    """The study's train cells through SLURM: wall time, the jobs and the records."""
    workdir = copy_checkout(root / name)
    cells = cell_ids(workdir, config, cluster.env)
    started = time.monotonic()
    snakemake(
        workdir, *[outputs.record_path(c) for c in cells], *SLURM_ARGS, config=config, env=cluster.env, timeout=3600
    )
    wall = time.monotonic() - started
    jobs = {j: f for j, f in cluster.sacct().items() if f["WorkDir"] == str(workdir)}
    records = {c: record.read(workdir / outputs.record_path(c)) for c in cells}
    submitted = min(datetime.fromisoformat(j["Submit"]) for j in jobs.values())
    span = (max(datetime.fromisoformat(j["End"]) for j in jobs.values()) - submitted).total_seconds()
    return {"workdir": workdir, "wall": wall, "jobs": jobs, "records": records, "span": span}


def benchmark_s(workdir: Path, cell: str) -> float | None:
    """Snakemake's own timing of the cell's job (its benchmark: file): the launcher and the cell;
    None where the job's Snakemake wrote none."""
    path = workdir / outputs.cell_dir(cell) / "benchmark.tsv"
    return float(path.read_text().splitlines()[1].split("\t")[0]) if path.exists() else None


def overhead(result: dict) -> None:
    """Per cell inside the one pack of `result`: where its time went."""
    (job,) = result["jobs"].values()
    span = (datetime.fromisoformat(job["End"]) - datetime.fromisoformat(job["Start"])).total_seconds()
    cells = list(result["records"])
    per_cell = span / len(cells)
    startup = statistics.median(r["summary"]["startup_s"] for r in result["records"].values())
    total = statistics.median(r["summary"]["total_s"] for r in result["records"].values())
    timed = [t for t in (benchmark_s(result["workdir"], c) for c in cells) if t is not None]
    snakejob = statistics.median(timed)
    training = total - startup
    rows = [
        ("job step start and its Snakemake's parse of the study", per_cell - snakejob),
        ("the cell's Snakemake job around the process (launcher, record checks)", snakejob - total),
        ("the process up to its first epoch (imports, data, FLOP count: startup_s)", startup),
        ("training and evaluation", training),
    ]
    print(f"\n{len(cells)} cells in one pack, nothing else running: the job took {span:.0f} s (1 s resolution)")
    if len(timed) < len(cells):
        print(f"  ({len(cells) - len(timed)} of the cells' jobs left no benchmark.tsv: the medians are of the rest)")
    for what, seconds in rows:
        print(f"  {what:75} {seconds:5.2f} s")
    cost = per_cell - training
    print(
        f"  per cell {per_cell:.2f} s, of which overhead {cost:.2f} s: target at most {OVERHEAD_TARGET_S:.0f} s, "
        f"ratio {cost / OVERHEAD_TARGET_S:.2f}"
    )
    parse = per_cell - snakejob
    print(
        f"  a persistent worker (one process running the pack's cells) would save at most the step and its "
        f"parse and the imports: about {parse + startup:.1f} s of {per_cell:.1f} s per cell here"
    )


def step_parse_s(root: Path, cells_wanted: int) -> tuple[int, float]:
    """Seconds one job step's Snakemake takes to parse a study of about `cells_wanted` cells and plan
    its one job (a dry run of what the slurm-jobstep executor runs per cell)."""
    workdir = copy_checkout(root / "parse")
    lrs = max(1, cells_wanted // (5 * 25))
    config = plan_benchmark.study(5, lrs)
    (workdir / "config" / "parse.yaml").write_text(yaml.safe_dump(config))
    cell = "synthetic-lenet-single-g1-b16-none-lr0p01"
    argv = [str(BIN / "snakemake"), "--snakefile", "Snakefile", "--target-jobs", f"train:cell={cell}"]
    argv += ["--allowed-rules", "train", "--cores", "1", "--configfiles", "config/parse.yaml", "--nolock"]
    argv += ["--mode", "remote", "-n"]
    started = time.monotonic()
    subprocess.run(argv, cwd=workdir, check=True, capture_output=True)
    return 5 * 25 * lrs, time.monotonic() - started


def compare(cells: int, packed: dict, unpacked: dict) -> None:
    """The study packed against the same study unpacked: jobs, wall time, the jobs' span."""
    print(f"\n{cells} one-epoch cells through the private SLURM (2 nodes on this machine's 2 cores):")
    print("  (wall: the snakemake run; jobs: first submission to last job's end, SLURM's 1 s resolution; the rest is")
    print("  the executor noticing the end: status checks from 40 s after submission, 10 s further apart each time)")
    for name, result in (("packed", packed), ("unpacked", unpacked)):
        per_job = len(result["records"]) / len(result["jobs"])
        print(
            f"  {name:9} {len(result['jobs']):3} SLURM jobs ({per_job:.1f} cells each): wall {result['wall']:6.1f} s, "
            f"jobs {result['span']:6.1f} s"
        )
    print(
        f"  packed/unpacked: wall {packed['wall'] / unpacked['wall']:.2f}, jobs {packed['span'] / unpacked['span']:.2f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", type=int, default=60)
    parser.add_argument("--alone", type=int, default=12)
    parser.add_argument("--parse-cells", type=int, default=10000)
    parser.add_argument("--keep", type=Path, help="run in this folder and keep it (default: a temporary one)")
    args = parser.parse_args()
    why = unavailable()
    if why:
        sys.exit(f"cannot run: {why}")
    print(f"the machine at the start: {reference()}")
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        cluster = SlurmCluster(root / "slurm").start()
        try:
            cells = args.cells // 4 * 4
            packed = run(root, "packed", study(cells, cells / 6), cluster)
            unpacked = run(root, "unpacked", study(cells, None), cluster)
            alone = run(root, "alone", study(args.alone, args.alone), cluster)
        finally:
            cluster.stop()
        parsed_cells, parse_s = step_parse_s(root, args.parse_cells)
        compare(cells, packed, unpacked)
        overhead(alone)  # reads the cells' benchmark files: before the folder goes
        print(f"\na job step's Snakemake parse of a {parsed_cells}-cell study: {parse_s:.2f} s")
    print(f"the machine at the end: {reference()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
