"""Packs on the private SLURM (issue 52): 61 short train cells under profiles/slurm in 6 SLURM jobs.

One study through the session's cluster (tests/e2e/conftest.py `cluster`), run once by the fixture
`packed` and asserted on by every test. Its 60 cells of one epoch and a cell that hangs in its
second epoch (the injected fault of dpstudy.engine.cell) are packed by `cluster.minutes_per_job` 11
at a guessed minute each. While the packs run, one pack (not the hung cell's) is cancelled with
scancel once all but 3 of its cells have their records: the run fails for it, a dry run then plans the pack's
unfinished cells and nothing else, and a rerun trains just those. A dry run before the first
plans the same study without packing.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.slurm_cluster import SLURM_ARGS
from helpers.workflow import (
    copy_checkout,
    dry_run,
    planned,
    progress,
    snakemake,
    start_snakemake,
    wait_for,
    wait_to_end,
)

from dpstudy.jobs import plan_file
from dpstudy.record import fields as record
from dpstudy.study import outputs

pytestmark = [pytest.mark.slow, pytest.mark.slurm]


def sweep(name: str, grid: dict, **more) -> dict:
    return {"name": name, "dataset": "synthetic", "model": "lenet", "grid": {"mode": ["single"], **grid}, **more}


SETTINGS, REPEATS = 15, 4
STUDY = {
    "study": "slurm_packs",
    "request_gpus": "always",  # the fake GPUs are reserved and accounted; the cells run on the CPU
    "datasets": {"synthetic": {"train_size": 128, "test_size": 32}},
    "defaults": {"epochs": 1, "repeats": REPEATS},
    "bench": {"kernels": False, "comm": False, "floor": False},
    "resources": {"mem_mb_per_process": 1500, "runtime_min": 2},
    # 61 cells at the guessed minute each: 6 packs of about 11 minutes
    "cluster": {"minutes_per_job": 11, "cell_minutes": 1},
    "sweeps": [
        sweep("grid", {"batch": [16, 32, 64], "lr": [0.01, 0.02, 0.03, 0.04, 0.05]}),
        # stopped by its own limit inside its pack, the pack's limit being the sum of its cells'
        sweep("hang", {"batch": [8]}, set={"epochs": 2, "repeats": 1}, resources={"runtime_min": 0.5}),
    ],
}
UNPACKED = {**STUDY, "cluster": {"minutes_per_job": None}}
CELLS = SETTINGS * REPEATS + 1
HUNG = "synthetic-lenet-single-g1-b8-none-epochs2"
HANG = {"DPSTUDY_INJECT_FAULT": "hang:0:2:1"}  # rank 0 stops answering at step 1 of epoch 2
# Two packs at a time (the profile's `jobs`, a site's cap on jobs queued at once): the private
# cluster would start all six, six cells at once on this machine's two cores beside the other
# tests' work, each cell's CPU time inflated by the crowding (6 % here at six against two).
TWO_AT_ONCE = ("--jobs", "2")


@dataclass
class Packed:
    workdir: Path
    packed_plan: str  # the first run's dpstudy: line
    unpacked_dry_run: str
    unpacked_planned: list[str]
    plan: dict[str, dict]  # results/plan/cells.json as the first run wrote it
    first_returncode: int
    first_output: str
    cancelled_pack: str
    cancelled_job: str
    after_first_run: dict[str, bytes]  # {cell: record.json}
    planned_after_first_run: dict[str, list[str]]
    rerun_output: str
    seconds: dict[str, float]


def targets(cells) -> list[str]:
    return [outputs.record_path(cell) for cell in sorted(cells)]


def summary_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith("dpstudy: ") and "train cells" in line]
    assert len(lines) == 1, output[-3000:]
    return lines[0]


def submitted(output: str) -> list[str]:
    return re.findall(r"submitted with SLURM jobid (\d+)", output)


def records(workdir: Path) -> dict[str, dict]:
    return {p.parent.name: record.read(p) for p in sorted((workdir / "results/cells").glob("*/record.json"))}


@pytest.fixture(scope="module")
def packed(cluster, tmp_path_factory) -> Packed:
    started, seconds = time.monotonic(), {}
    workdir = copy_checkout(tmp_path_factory.mktemp("packs"))
    unpacked_dry = snakemake(workdir, *SLURM_ARGS, "-n", config=UNPACKED, env=cluster.env)
    unpacked_planned = planned(unpacked_dry)["train"]
    all_records = targets(unpacked_planned)
    log = workdir / "first.out"
    first = start_snakemake(
        workdir, *all_records, *SLURM_ARGS, *TWO_AT_ONCE, config=STUDY, env={**cluster.env, **HANG}, log=log
    )
    watched = progress(workdir, log)
    try:
        plan_path = workdir / plan_file.PATH
        wait_for(plan_path.exists, first, plan_file.PATH, watched)
        plan = json.loads(plan_path.read_text())
        # the pack to cancel: the first but the hung cell's; once all but 3 of its cells have a record
        cancelled_pack = sorted({e["pack"] for e in plan.values()} - {plan[HUNG]["pack"]})[0]
        members = [cell for cell, entry in plan.items() if entry["pack"] == cancelled_pack]
        done = lambda: [c for c in members if (workdir / outputs.record_path(c)).exists()]  # noqa: E731
        wait_for(lambda: len(done()) >= len(members) - 3, first, f"records of {cancelled_pack}'s cells", watched)
        job = record.read(workdir / outputs.record_path(done()[0]))["env"]["job"]["job_id"]
        cluster.client("scancel", job)
        first_returncode = wait_to_end(first, watched)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    seconds["first run"] = time.monotonic() - started
    paths = {c: workdir / outputs.record_path(c) for c in plan}
    after = {c: path.read_bytes() for c, path in paths.items() if path.exists()}
    planned_after = dry_run(workdir, STUDY, *all_records, *SLURM_ARGS, env=cluster.env)
    rerun = snakemake(workdir, *all_records, *SLURM_ARGS, *TWO_AT_ONCE, config=STUDY, env=cluster.env, timeout=600)
    seconds["with the rerun"] = time.monotonic() - started
    print(f"packs: {seconds}")
    return Packed(
        workdir=workdir,
        packed_plan=summary_line(log.read_text(errors="replace")),
        unpacked_dry_run=summary_line(unpacked_dry.stdout + unpacked_dry.stderr),
        unpacked_planned=unpacked_planned,
        plan=plan,
        first_returncode=first_returncode,
        first_output=log.read_text(errors="replace"),
        cancelled_pack=cancelled_pack,
        cancelled_job=job,
        after_first_run=after,
        planned_after_first_run=planned_after,
        rerun_output=rerun.stdout + rerun.stderr,
        seconds=seconds,
    )


def test_the_study_runs_in_six_jobs_where_unpacked_it_would_take_one_per_cell(cluster, packed):
    assert packed.packed_plan == (
        f"dpstudy: {CELLS} train cells in 6 jobs: 6 packs of 10-11 cells (about 11 min each); "
        "at most 10000 jobs (the SLURM controller's MaxJobCount)"
    )
    assert len(packed.unpacked_planned) == CELLS
    assert packed.unpacked_dry_run.startswith(f"dpstudy: {CELLS} train cells, one job each")
    jobs = submitted(packed.first_output)
    assert len(jobs) == 6, packed.first_output[-3000:]
    finished = cluster.sacct()
    ours = {job for job, fields in finished.items() if fields["WorkDir"] == str(packed.workdir)}
    assert set(jobs) <= ours and len(ours - set(jobs)) == len(submitted(packed.rerun_output))


def test_every_cell_is_recorded_once_with_its_pack_and_estimate(packed):
    ran = records(packed.workdir)
    assert len(ran) == CELLS and set(ran) == set(packed.plan)
    assert sum(rec["status"] == "ok" for rec in ran.values()) == CELLS - 1
    first_jobs = set(submitted(packed.first_output))
    for cell, rec in ran.items():
        job = rec["env"]["job"]
        if cell in packed.after_first_run:  # trained in its pack, and not again
            assert job["pack"] == packed.plan[cell]["pack"] and job["job_id"] in first_jobs
            assert job["estimated_s"] == 60.0
            assert (packed.workdir / outputs.record_path(cell)).read_bytes() == packed.after_first_run[cell]
    packs: dict[str, set[str]] = {}
    for cell, entry in packed.plan.items():
        packs.setdefault(re.sub(r"-r\d+$", "", cell), set()).add(entry["pack"])
    assert all(len(groups) == REPEATS for cell, groups in packs.items() if cell != HUNG)  # repeats spread


def test_a_pack_asks_for_the_sum_of_its_cells_limits(cluster, packed):
    finished = cluster.sacct()
    limits = {c: 1 + (1 if c == HUNG else 2) for c in packed.plan}  # whole minutes, and one each (submission.py)
    for job in submitted(packed.first_output):
        cells = {c for c, rec in records(packed.workdir).items() if rec["env"]["job"]["job_id"] == job}
        if job != packed.cancelled_job:
            assert int(finished[job]["TimelimitRaw"]) == sum(limits[c] for c in cells), job


def test_a_hung_cell_is_stopped_at_its_limit_and_its_pack_goes_on(cluster, packed):
    rec = records(packed.workdir)[HUNG]
    assert rec["status"] == "failed" and rec["reason"].startswith("stopped at its time limit of 30 s")
    pack = packed.plan[HUNG]["pack"]
    mates = [c for c, e in packed.plan.items() if e["pack"] == pack and c != HUNG]
    ran = records(packed.workdir)
    assert len(mates) >= 9 and all(ran[c]["status"] == "ok" for c in mates)
    assert {ran[c]["env"]["job"]["job_id"] for c in [*mates, HUNG]} == {rec["env"]["job"]["job_id"]}
    assert cluster.sacct()[rec["env"]["job"]["job_id"]]["State"] == "COMPLETED"


def test_a_cancelled_pack_keeps_its_finished_records_and_the_rerun_runs_the_rest(cluster, packed):
    assert packed.first_returncode != 0
    assert cluster.sacct()[packed.cancelled_job]["State"] == "CANCELLED"
    members = {c for c, e in packed.plan.items() if e["pack"] == packed.cancelled_pack}
    kept = members & set(packed.after_first_run)
    assert kept and kept != members
    assert set(packed.after_first_run) == set(packed.plan) - (members - kept)  # every other pack finished
    assert sorted(packed.planned_after_first_run["train"]) == sorted(members - kept)
    rerun = {rec["env"]["job"]["job_id"] for c, rec in records(packed.workdir).items() if c in members - kept}
    assert rerun == set(submitted(packed.rerun_output))
