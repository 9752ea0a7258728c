"""The study through a real (private) SLURM with `snakemake --profile profiles/slurm`.

The session's private cluster of two nodes (tests/e2e/conftest.py `cluster`) and one study through it, run
once by the fixture `study` and asserted on by every test: cells on one node, a DDP cell over two
nodes through srun torchrun, two cells that SLURM stops at their time and memory limits, and a DDP
cell cancelled with scancel after its first epoch. The first run finishes the other cells
(--keep-going) and fails for the cancelled one; a dry run then plans just that cell, and a second
run trains it and makes the HTML report. While SLURM waits out the time-limited cell's minute, the
same one-node cells run locally (the reference the records are compared with) and two of them
through profiles/cluster-generic against the same SLURM.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pandas as pd
import pytest
from helpers.slurm_cluster import SLURM_ARGS
from helpers.workflow import copy_checkout, dry_run, progress, snakemake, start_snakemake, wait_for_text, wait_to_end

from dpstudy.record import fields as record
from dpstudy.record.fields import HOST_PARTS, IN_CELL_RATES, PROBE_FIELDS
from dpstudy.study import outputs

pytestmark = [pytest.mark.slow, pytest.mark.slurm]


def sweep(name: str, grid: dict, **more) -> dict:
    return {"name": name, "dataset": "synthetic", "model": "lenet", "grid": grid, **more}


# Single (ok), DP (skipped: it needs CUDA) and DDP on two GPUs of one node; with the two-node cell
# the report compares DDP at world size 2 on one node and on two.
ONE_NODE = [
    sweep("single", {"mode": ["single"], "batch": [64]}),
    sweep("modes", {"mode": ["dp", "ddp"], "gpus": [2], "batch": [64], "backend": ["gloo"]}),
]
STUDY = {
    "study": "slurm_test",
    "request_gpus": "always",  # the fake GPUs are reserved and accounted; the cells run on the CPU
    "datasets": {"synthetic": {"train_size": 512, "test_size": 128}},
    "defaults": {"epochs": 1},
    "bench": {"kernels": False, "comm": False},
    "resources": {"mem_mb_per_process": 1500, "runtime_min": 10},  # plus mem_mb_per_job's 1000 per job
    "sweeps": [
        *ONE_NODE,
        sweep("nodes", {"mode": ["ddp"], "gpus": [1], "nodes": [2], "batch": [64], "backend": ["gloo"]}),
        sweep("slow", {"mode": ["single"], "batch": [8]}, set={"epochs": 1000}, resources={"runtime_min": 1}),
        # Above the job's own Snakemake in the batch step (about 240 MB), below torch (over 600 MB):
        # SLURM stops the training step, not the wrapper. At 200 the wrapper itself was stopped at times.
        sweep("big", {"mode": ["single"], "batch": [16]}, resources={"mem_mb_per_process": 400, "mem_mb_per_job": 0}),
        sweep("long", {"mode": ["ddp"], "gpus": [2], "batch": [8], "backend": ["gloo"]}, set={"epochs": 2}),
    ],
}
LOCAL = {**STUDY, "sweeps": ONE_NODE}
ONE_NODE_CELLS = {
    "synthetic-lenet-single-g1-b64-none",
    "synthetic-lenet-dp-g2-b64-none",
    "synthetic-lenet-ddp-g2-b64-gloo",
}
GENERIC_CELLS = {"synthetic-lenet-single-g1-b64-none", "synthetic-lenet-ddp-g2-b64-gloo"}
TWO_NODES = "synthetic-lenet-ddp-g1-b64-gloo-nodes2"
TIMED_OUT = "synthetic-lenet-single-g1-b8-none-epochs1000"
OUT_OF_MEMORY = "synthetic-lenet-single-g1-b16-none"
CANCELLED = "synthetic-lenet-ddp-g2-b8-gloo-epochs2"
ALL_CELLS = ONE_NODE_CELLS | {TWO_NODES, TIMED_OUT, OUT_OF_MEMORY, CANCELLED}
# The first SLURM run's jobs only: rank 0 stops answering at step 1 of epoch 2 (the injected fault
# of dpstudy.engine.cell), so the time-limited cell waits out its minute without taking a core and
# the cell to cancel is still running after its first epoch. The other cells train one epoch; the
# rerun runs without it.
HANG = {"DPSTUDY_INJECT_FAULT": "hang:0:2:1"}
GENERIC_ARGS = (
    "--profile",
    "profiles/cluster-generic",
    "--seconds-between-status-checks",
    "2",
    *(
        arg
        for action in ("submit", "status", "cancel")
        for arg in (f"--cluster-generic-{action}-cmd", f"python -m dpstudy.jobs.schedulers --scheduler slurm {action}")
    ),
)


@dataclass
class Study:
    workdir: Path  # the SLURM study
    output: str  # both SLURM runs' snakemake output
    first_returncode: int  # of the run in which CANCELLED was cancelled
    cancelled_job: str
    after_first_run: dict[str, bytes]  # {cell: record.json} of the cells with a record then
    planned_after_first_run: dict[str, list[str]]  # a dry run's jobs then
    tables_before: pd.DataFrame  # collect's cells table of those records
    rerun_output: str
    local: Path  # the one-node cells run locally: the reference
    local_returncode: int
    local_output: str
    generic: Path  # two of them through profiles/cluster-generic
    generic_returncode: int
    generic_output: str


def targets(cells) -> list[str]:
    return [outputs.record_path(cell) for cell in sorted(cells)]


def ended(proc: subprocess.Popen, log: Path, workdir: Path) -> tuple[int, str]:
    """(return code, output) of a snakemake started in `workdir` with start_snakemake(..., log=log),
    once it ends; a run that makes no progress for STALL_S fails the wait (helpers.workflow)."""
    return wait_to_end(proc, progress(workdir, log)), log.read_text(errors="replace")


def start_collect(workdir: Path, cells, out: Path) -> subprocess.Popen:
    """The workflow's collect script on these cells' records as its rule runs it (importing dpstudy
    from the workflow's folder: dpstudy.record.provenance.export_checkout), in the background."""
    return subprocess.Popen(
        [sys.executable, "scripts/collect.py", "--records", *targets(cells), "--out-dir", str(out)]
        + ["--memory-plan", outputs.MEMORY_PLAN],
        cwd=workdir,
        env={**os.environ, "PYTHONPATH": str(workdir)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


@pytest.fixture(scope="module")
def study(cluster, tmp_path_factory) -> Study:
    """The SLURM study, the cancellation and the rerun; the local reference and the cluster-generic
    run in the time-limited cell's minute. Each run is timed on stdout (pytest -s)."""
    started = time.monotonic()
    workdir, local, generic = (tmp_path_factory.mktemp(name) for name in ("slurm", "local", "generic"))
    copy_checkout(workdir)
    for other in (local, generic):  # the same code: a record holds the hash of the code that made it
        shutil.copytree(workdir, other, dirs_exist_ok=True)
    logs = {path: path / "snakemake.out" for path in (workdir, local, generic)}
    first = start_snakemake(workdir, *SLURM_ARGS, config=STUDY, env={**cluster.env, **HANG}, log=logs[workdir])
    running = [first]  # each in a session of its own, killed with its children if still running
    try:
        # SLURM stops a job past its time limit in a check every 30 s from the controller's start:
        # the time-limited job ends 90 s after the cluster started if it starts within 30 s. Nothing
        # else runs until it is submitted (the cluster has room for all the study's jobs at once).
        watched = progress(workdir, logs[workdir])
        wait_for_text(logs[workdir], f"/rule_train/{TIMED_OUT}/", first, watched)
        in_local = start_snakemake(
            local, *targets(ONE_NODE_CELLS), "--cores", "2", "--resources", "gpu=2", config=LOCAL, log=logs[local]
        )
        in_generic = start_snakemake(
            generic, *targets(GENERIC_CELLS), *GENERIC_ARGS, config=LOCAL, env=cluster.env, log=logs[generic]
        )
        running += [in_local, in_generic]
        for proc in (in_local, in_generic):  # and what they start: the SLURM study's jobs come first
            os.setpriority(os.PRIO_PROCESS, proc.pid, 10)
        wait_for_text(workdir / f"results/cells/{CANCELLED}/train.log", "epoch 1/", first, watched)
        job = json.loads((workdir / f"results/cells/{CANCELLED}/attempt.json").read_text())["job_id"]
        cluster.client("scancel", job)
        first_returncode, output = ended(first, logs[workdir], workdir)
        print(f"first SLURM run: {time.monotonic() - started:.0f} s")
        after_first_run = {
            cell: (workdir / outputs.record_path(cell)).read_bytes()
            for cell in ALL_CELLS
            if (workdir / outputs.record_path(cell)).exists()
        }
        tables_dir = tmp_path_factory.mktemp("tables_before")
        running.append(collect := start_collect(workdir, after_first_run, tables_dir))
        planned = dry_run(workdir, STUDY)
        collect_output = collect.communicate(timeout=300)[0]
        assert collect.returncode == 0, f"collect failed:\n{collect_output[-4000:]}"
        rerun = snakemake(workdir, *SLURM_ARGS, config=STUDY, env=cluster.env, timeout=900)
        print(f"the rerun too: {time.monotonic() - started:.0f} s")
        local_returncode, local_output = ended(in_local, logs[local], local)
        generic_returncode, generic_output = ended(in_generic, logs[generic], generic)
        print(f"the local and cluster-generic runs too: {time.monotonic() - started:.0f} s")
    finally:
        for proc in running:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return Study(
        workdir=workdir,
        output=output + rerun.stdout + rerun.stderr,
        first_returncode=first_returncode,
        cancelled_job=job,
        after_first_run=after_first_run,
        planned_after_first_run=planned,
        tables_before=pd.read_csv(tables_dir / "cells.csv").set_index("cell"),
        rerun_output=rerun.stdout + rerun.stderr,
        local=local,
        local_returncode=local_returncode,
        local_output=local_output,
        generic=generic,
        generic_returncode=generic_returncode,
        generic_output=generic_output,
    )


def records(workdir: Path) -> dict[str, dict]:
    return {p.parent.name: record.read(p) for p in sorted((workdir / "results/cells").glob("*/record.json"))}


def submitted_jobs(output: str) -> dict[str, list[str]]:
    """{cell: [SLURM job ids]} from the executor's submission lines."""
    jobs: dict[str, list[str]] = {}
    for job, log in re.findall(r"submitted with SLURM jobid (\d+) \(log: \S*/rule_train/([^/]+)/", output):
        jobs.setdefault(log, []).append(job)
    return jobs


def test_the_study_runs_to_the_report_and_every_train_job_was_a_slurm_job(cluster, study):
    cells = pd.read_csv(study.workdir / "results/tables/cells.csv").set_index("cell")
    assert set(cells.index) == ALL_CELLS
    assert (study.workdir / "results/report/report.html").stat().st_size > 0
    submitted = submitted_jobs(study.output)
    assert set(submitted) == set(cells.index)
    finished = cluster.sacct()
    for cell, rec in records(study.workdir).items():
        job = rec["env"]["job"]
        assert job["scheduler"] == "slurm" and job["job_id"] == submitted[cell][-1]
        assert finished[job["job_id"]]["State"] == "COMPLETED"
    # the cells that SLURM stopped ran twice: the stopped attempt, then the retry that recorded why
    assert finished[submitted[TIMED_OUT][0]]["State"] == "TIMEOUT"
    assert finished[submitted[OUT_OF_MEMORY][0]]["State"] != "COMPLETED"


def test_concurrent_gpu_jobs_saw_distinct_gpus(cluster, study):
    """Every attempt that trained (attempt.json: its job and the GPUs its processes got), the
    time-limited cell's first attempt among them: a minute on one GPU while others come and go."""
    finished = cluster.sacct()
    spans = []
    for attempt_file in (study.workdir / "results/cells").glob("*/attempt.json"):
        attempt = json.loads(attempt_file.read_text())
        job = finished[attempt["job_id"]]
        times = [datetime.fromisoformat(job[k]) for k in ("Start", "End")]
        spans.append((*times, job["NodeList"], set(attempt["cuda_visible_devices"].split(","))))
    overlapping = [
        (a, b) for i, a in enumerate(spans) for b in spans[i + 1 :] if a[2] == b[2] and a[0] < b[1] and b[0] < a[1]
    ]
    assert overlapping, "no two GPU jobs ran at once on one node"
    for a, b in overlapping:
        assert not a[3] & b[3], f"jobs running together on {a[2]} shared GPUs {a[3]} and {b[3]}"


def comparable(rec: dict) -> dict:
    """A record without its timing and host fields."""
    rec = copy.deepcopy(rec)
    for epoch in rec["epochs"]:
        for key in (
            "wall_s",
            "eval_s",
            "data_wait_s",
            "compute_s",
            "samples_per_s",
            "peak_mem_mb",
            "steady_s",
            "other_load",
        ):
            epoch.pop(key)
        for key in IN_CELL_RATES:  # the machine's speed at that moment
            epoch.pop(key, None)
    for key in ("median_epoch_s", "samples_per_s", "startup_s", "total_s"):
        rec["summary"].pop(key)
    for key in PROBE_FIELDS:  # its times (every field but the counts and sizes, in seconds) and
        if key.endswith("_s") or key == "steps":  # the steps it timed: fewer when a step was slow
            (rec.get("probe") or {}).pop(key, None)
    if rec.get("trace"):  # its times and the rank that set the pace vary; what was traced does not
        rec["trace"] = {
            "steps": rec["trace"]["steps"],
            "reason": rec["trace"]["reason"],
            "ranks": [
                {
                    **{k: rank[k] for k in ("rank", "steps", "activity", "file", "reason")},
                    "collectives": {c: (v["calls"], v["bytes"]) for c, v in rank["collectives"].items()},
                }
                for rank in rec["trace"]["ranks"]
            ],
        }
    for key in ("hostname", "job", "cpu", "cpu_count"):
        rec["env"].pop(key, None)
    for key in HOST_PARTS:  # the resident memory a process measured, like peak_mem_mb: not the same twice
        (rec.get("memory") or {}).pop(key, None)
    rec["env"]["ranks"] = [(r["rank"], r["local_rank"]) for r in rec["env"]["ranks"]]
    return rec


def test_records_equal_a_local_runs_but_for_timing_and_host(study):
    assert study.local_returncode == 0, study.local_output[-4000:]
    through_slurm, local = records(study.workdir), records(study.local)
    assert set(local) == ONE_NODE_CELLS
    for cell in ONE_NODE_CELLS:
        assert comparable(through_slurm[cell]) == comparable(local[cell]), cell
    assert {local[c]["status"] for c in ONE_NODE_CELLS} == {"ok", "skipped"}


def test_a_two_node_cell_runs_srun_torchrun_with_a_rank_on_each_node(cluster, study):
    workdir = study.workdir
    rec = records(workdir)[TWO_NODES]
    assert rec["status"] == "ok" and rec["env"]["world_size"] == 2 and rec["env"]["nodes"] == 2
    assert sorted(r["node"] for r in rec["env"]["ranks"]) == ["n1", "n2"]
    assert cluster.sacct()[rec["env"]["job"]["job_id"]]["NodeList"] == "n[1-2]"
    log = (workdir / f"results/cells/{TWO_NODES}/train.log").read_text()
    assert re.search(
        r"running: srun --nodes=2 --ntasks=2 --ntasks-per-node=1 .*torchrun --log-dir=\S+ --nnodes=2 "
        r"--nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint=127\.0\.0\.1:\d+",
        log,
    )
    cells = pd.read_csv(workdir / "results/tables/cells.csv").set_index("cell")
    assert cells.loc[TWO_NODES, "devices"] == 2 and sorted(cells.loc[TWO_NODES, "rank_nodes"].split("; ")) == [
        "n1",
        "n2",
    ]
    html = (workdir / "results/report/report.html").read_text()
    assert "Intra- vs inter-node scaling" in html and "spread over 2 nodes" in html


def test_time_and_memory_limits_become_failed_cells_with_slurms_reason(study):
    timed_out, out_of_memory = records(study.workdir)[TIMED_OUT], records(study.workdir)[OUT_OF_MEMORY]
    assert timed_out["status"] == out_of_memory["status"] == "failed"
    assert re.fullmatch(
        r"SLURM job \d+ was stopped at its time limit of 00:01:00 after 00:01:\d\d "
        r"\(state TIMEOUT, reason TimeLimit\)",
        timed_out["reason"],
    )
    assert re.search(
        r"SLURM job \d+ was stopped at its memory limit .*exceeded memory limit \(\d+ > 419430400\)",
        out_of_memory["reason"],
    )
    html = (study.workdir / "results/report/report.html").read_text()
    assert "was stopped at its time limit" in html and "was stopped at its memory limit" in html


def test_a_cancelled_cell_leaves_no_record_and_a_rerun_runs_just_it(cluster, study):
    """scancel after the cell's first epoch, the rest of the study running on: the first run
    fails, leaves no record of that cell and the others' records; the rerun trains just that cell
    and touches neither the others' records nor their rows of the tables."""
    assert study.first_returncode != 0  # the cancelled cell failed the run
    assert cluster.sacct()[study.cancelled_job]["State"] == "CANCELLED"
    assert set(study.after_first_run) == ALL_CELLS - {CANCELLED}
    assert study.planned_after_first_run["train"] == [CANCELLED]
    assert set(submitted_jobs(study.rerun_output)) == {CANCELLED}
    assert records(study.workdir)[CANCELLED]["status"] == "ok"
    assert {c: (study.workdir / outputs.record_path(c)).read_bytes() for c in study.after_first_run} == (
        study.after_first_run
    )
    tables_after = pd.read_csv(study.workdir / "results/tables/cells.csv").set_index("cell")
    pd.testing.assert_frame_equal(tables_after.loc[study.tables_before.index], study.tables_before)


def test_the_cluster_generic_profile_submits_through_its_template(cluster, study):
    """profiles/cluster-generic with dpstudy.jobs.schedulers' SLURM flavour: the same path a PBS, SGE or
    LSF user takes, run against a real scheduler."""
    assert study.local_returncode == 0, study.local_output[-4000:]
    assert study.generic_returncode == 0, study.generic_output[-4000:]
    finished = cluster.sacct()
    ran, local = records(study.generic), records(study.local)
    assert set(ran) == GENERIC_CELLS
    for cell, rec in ran.items():
        assert finished[rec["env"]["job"]["job_id"]]["State"] == "COMPLETED"
        assert finished[rec["env"]["job"]["job_id"]]["JobName"] == f"dpstudy.train.{cell}"
        assert comparable(rec) == comparable(local[cell]), cell
