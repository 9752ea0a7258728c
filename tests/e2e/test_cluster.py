"""The study through a real (private) SLURM with `snakemake --profile profiles/slurm`.

One module-wide cluster of two nodes with two fake GPUs each (tests/helpers/slurm_cluster.py). A small
study runs through it to the HTML report: cells on one node, a DDP cell over two nodes through
srun torchrun, and two cells that SLURM stops at their time and memory limits. Then a cell is
cancelled mid-run with scancel and rerun. A local run of the same cells is the reference.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import time
from datetime import datetime
from pathlib import Path

import pandas as pd
import pytest
from helpers.slurm_cluster import SlurmCluster, unavailable
from helpers.workflow import copy_checkout, dry_run, snakemake, start_snakemake, wait_for_text

from dpstudy.record import fields as record

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

ONE_NODE = {
    "name": "modes",
    "dataset": "synthetic",
    "model": "lenet",
    "grid": {"mode": ["single", "dp", "ddp"], "gpus": [1, 2], "batch": [64], "backend": ["gloo"]},
}
STUDY = {
    "study": "slurm_test",
    "request_gpus": "always",  # the fake GPUs are reserved and accounted; the cells run on the CPU
    "datasets": {"synthetic": {"train_size": 512, "test_size": 128}},
    "defaults": {"epochs": 2},
    "bench": {"kernels": False, "comm": False},
    "resources": {"mem_mb_per_process": 1500, "runtime_min": 10},  # plus mem_mb_per_job's 1000 per job
    "sweeps": [
        ONE_NODE,
        {
            "name": "nodes",
            "dataset": "synthetic",
            "model": "lenet",
            "grid": {"mode": ["ddp"], "gpus": [1], "nodes": [2], "batch": [64], "backend": ["gloo"]},
        },
        {
            "name": "slow",
            "dataset": "synthetic",
            "model": "lenet",
            "grid": {"mode": ["single"], "batch": [8]},
            "set": {"epochs": 1000},
            "resources": {"runtime_min": 1},
        },
        {
            "name": "big",
            "dataset": "synthetic",
            "model": "lenet",
            "grid": {"mode": ["single"], "batch": [16]},
            # Above the job's own Snakemake in the batch step (about 240 MB), below torch (over 600 MB):
            # SLURM stops the training step, not the wrapper. At 200 the wrapper itself was stopped at times.
            "resources": {"mem_mb_per_process": 400, "mem_mb_per_job": 0},
        },
    ],
}
LOCAL = {**STUDY, "sweeps": [ONE_NODE]}
ONE_NODE_CELLS = {
    "synthetic-lenet-single-g1-b64-none",
    "synthetic-lenet-dp-g1-b64-none",
    "synthetic-lenet-dp-g2-b64-none",
    "synthetic-lenet-ddp-g1-b64-gloo",
    "synthetic-lenet-ddp-g2-b64-gloo",
}
TWO_NODES = "synthetic-lenet-ddp-g1-b64-gloo-nodes2"
TIMED_OUT = "synthetic-lenet-single-g1-b8-none-epochs1000"
OUT_OF_MEMORY = "synthetic-lenet-single-g1-b16-none"
# The tests' own speed-ups: the first status check after 2 s instead of 40 s.
SLURM_ARGS = (
    "--profile",
    "profiles/slurm",
    "--slurm-status-command",
    "squeue",
    "--slurm-init-seconds-before-status-checks",
    "2",
)


@pytest.fixture(scope="module")
def cluster():
    why = unavailable()
    if why:
        pytest.skip(why)
    cluster = SlurmCluster()
    try:
        yield cluster.start()
    finally:
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)


@pytest.fixture(scope="module")
def slurm_run(cluster, tmp_path_factory):
    workdir = copy_checkout(tmp_path_factory.mktemp("slurm"))
    started = time.monotonic()
    proc = snakemake(workdir, *SLURM_ARGS, config=STUDY, env=cluster.env, timeout=1200)
    proc.seconds = time.monotonic() - started
    print(f"SLURM study: {proc.seconds:.0f} s")
    return workdir, proc


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    workdir = copy_checkout(tmp_path_factory.mktemp("local"))
    started = time.monotonic()
    snakemake(workdir, "--cores", "2", "--resources", "gpu=2", config=LOCAL, timeout=900)
    print(f"the same one-node cells locally: {time.monotonic() - started:.0f} s")
    return workdir


def records(workdir: Path) -> dict[str, dict]:
    return {p.parent.name: record.read(p) for p in sorted((workdir / "results/cells").glob("*/record.json"))}


def submitted_jobs(output: str) -> dict[str, list[str]]:
    """{cell: [SLURM job ids]} from the executor's submission lines."""
    jobs: dict[str, list[str]] = {}
    for job, log in re.findall(r"submitted with SLURM jobid (\d+) \(log: \S*/rule_train/([^/]+)/", output):
        jobs.setdefault(log, []).append(job)
    return jobs


def test_the_study_runs_to_the_report_and_every_train_job_was_a_slurm_job(cluster, slurm_run):
    workdir, proc = slurm_run
    cells = pd.read_csv(workdir / "results/tables/cells.csv").set_index("cell")
    assert set(cells.index) == ONE_NODE_CELLS | {TWO_NODES, TIMED_OUT, OUT_OF_MEMORY}
    assert (workdir / "results/report/report.html").stat().st_size > 0
    submitted = submitted_jobs(proc.stdout + proc.stderr)
    assert set(submitted) == set(cells.index)
    finished = cluster.finished_jobs()  # the controller's own log of every job
    for cell, rec in records(workdir).items():
        job = rec["env"]["job"]
        assert job["scheduler"] == "slurm" and job["job_id"] == submitted[cell][-1]
        assert finished[job["job_id"]]["JobState"] == "COMPLETED"
    # the cells that SLURM stopped ran twice: the stopped attempt, then the retry that recorded why
    assert finished[submitted[TIMED_OUT][0]]["JobState"] == "TIMEOUT"
    assert finished[submitted[OUT_OF_MEMORY][0]]["JobState"] != "COMPLETED"


def test_concurrent_gpu_jobs_saw_distinct_gpus(cluster, slurm_run):
    """Every attempt that trained (attempt.json: its job and the GPUs its processes got), the
    time-limited cell's first attempt among them: a minute on one GPU while others come and go."""
    workdir, _ = slurm_run
    finished = cluster.finished_jobs()
    spans = []
    for attempt_file in (workdir / "results/cells").glob("*/attempt.json"):
        attempt = json.loads(attempt_file.read_text())
        job = finished[attempt["job_id"]]
        times = [datetime.fromisoformat(job[k]) for k in ("StartTime", "EndTime")]
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
    for key in ("median_epoch_s", "samples_per_s", "startup_s", "total_s"):
        rec["summary"].pop(key)
    for key in ("sync_step_s", "nosync_step_s", "allreduce_s", "scatter_s", "replicate_s", "gather_s"):
        (rec.get("probe") or {}).pop(key, None)
    for key in ("hostname", "job", "cpu", "cpu_count"):
        rec["env"].pop(key, None)
    rec["env"]["ranks"] = [(r["rank"], r["local_rank"]) for r in rec["env"]["ranks"]]
    return rec


def test_records_equal_a_local_runs_but_for_timing_and_host(slurm_run, local_run):
    workdir, _ = slurm_run
    through_slurm, local = records(workdir), records(local_run)
    assert set(local) == ONE_NODE_CELLS
    for cell in ONE_NODE_CELLS:
        assert comparable(through_slurm[cell]) == comparable(local[cell]), cell
    assert {local[c]["status"] for c in ONE_NODE_CELLS} == {"ok", "skipped"}


def test_a_two_node_cell_runs_srun_torchrun_with_a_rank_on_each_node(cluster, slurm_run):
    workdir, _ = slurm_run
    rec = records(workdir)[TWO_NODES]
    assert rec["status"] == "ok" and rec["env"]["world_size"] == 2 and rec["env"]["nodes"] == 2
    assert sorted(r["node"] for r in rec["env"]["ranks"]) == ["n1", "n2"]
    assert cluster.finished_jobs()[rec["env"]["job"]["job_id"]]["NodeList"] == "n[1-2]"
    log = (workdir / f"results/cells/{TWO_NODES}/train.log").read_text()
    assert re.search(
        r"running: srun --nodes=2 --ntasks=2 --ntasks-per-node=1 .*torchrun --nnodes=2 "
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


def test_time_and_memory_limits_become_failed_cells_with_slurms_reason(slurm_run):
    workdir, _ = slurm_run
    timed_out, out_of_memory = records(workdir)[TIMED_OUT], records(workdir)[OUT_OF_MEMORY]
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
    html = (workdir / "results/report/report.html").read_text()
    assert "was stopped at its time limit" in html and "was stopped at its memory limit" in html


def test_a_cancelled_cell_leaves_no_record_and_a_rerun_runs_just_it(cluster, slurm_run):
    workdir, _ = slurm_run
    before = {cell: (workdir / f"results/cells/{cell}/record.json").read_bytes() for cell in records(workdir)}
    tables_before = pd.read_csv(workdir / "results/tables/cells.csv").set_index("cell")
    long_cell = "synthetic-lenet-ddp-g2-b8-gloo-epochs60"
    config = copy.deepcopy(STUDY)
    config["sweeps"].append(
        {
            "name": "long",
            "dataset": "synthetic",
            "model": "lenet",
            "grid": {"mode": ["ddp"], "gpus": [2], "batch": [8], "backend": ["gloo"]},
            "set": {"epochs": 60},
        }
    )
    proc = start_snakemake(workdir, *SLURM_ARGS, config=config, env=cluster.env)
    try:
        wait_for_text(workdir / f"results/cells/{long_cell}/train.log", "epoch 1/", proc)
        job = json.loads((workdir / f"results/cells/{long_cell}/attempt.json").read_text())["job_id"]
        cluster.client("scancel", job)
        assert proc.wait(timeout=300) != 0  # the cancelled cell failed the run
    finally:
        if proc.poll() is None:
            proc.kill()
    assert cluster.finished_jobs()[job]["JobState"] == "CANCELLED"
    assert not (workdir / f"results/cells/{long_cell}/record.json").exists()
    assert {c: (workdir / f"results/cells/{c}/record.json").read_bytes() for c in before} == before
    assert dry_run(workdir, config)["train"] == [long_cell]
    snakemake(workdir, *SLURM_ARGS, config=config, env=cluster.env, timeout=900)
    assert records(workdir)[long_cell]["status"] == "ok"
    tables_after = pd.read_csv(workdir / "results/tables/cells.csv").set_index("cell")
    pd.testing.assert_frame_equal(tables_after.loc[tables_before.index], tables_before)


def test_the_cluster_generic_profile_submits_through_its_template(cluster, local_run, tmp_path):
    """profiles/cluster-generic with dpstudy.jobs.schedulers' SLURM flavour: the same path a PBS, SGE or
    LSF user takes, run against a real scheduler."""
    workdir = copy_checkout(tmp_path)
    commands = {
        action: f"python -m dpstudy.jobs.schedulers --scheduler slurm {action}"
        for action in ("submit", "status", "cancel")
    }
    snakemake(
        workdir,
        "--profile",
        "profiles/cluster-generic",
        "--seconds-between-status-checks",
        "2",
        *(arg for action, cmd in commands.items() for arg in (f"--cluster-generic-{action}-cmd", cmd)),
        config=LOCAL,
        env=cluster.env,
        timeout=900,
    )
    finished = cluster.finished_jobs()
    ran, local = records(workdir), records(local_run)
    assert set(ran) == ONE_NODE_CELLS
    for cell, rec in ran.items():
        assert finished[rec["env"]["job"]["job_id"]]["JobState"] == "COMPLETED"
        assert finished[rec["env"]["job"]["job_id"]]["Name"] == f"dpstudy.train.{cell}"
        assert comparable(rec) == comparable(local[cell]), cell
