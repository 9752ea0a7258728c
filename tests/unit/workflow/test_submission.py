"""How a cluster run submits the cells (dpstudy.workflow.submission, .estimates): estimates from
earlier records, packs within the study's and the site's limits, a packed cell's resources, the plan
each job reads back, and the profile settings a packing run needs, named when missing."""

from __future__ import annotations

import copy
import json
import os
import stat

import pytest

from dpstudy.jobs import packing, plan_file
from dpstudy.record import fields as record
from dpstudy.study import outputs
from dpstudy.workflow import estimates, submission
from dpstudy.workflow.planning import load_study

STUDY = {
    "study": "pack_test",
    "datasets": {"synthetic": {"train_size": 256, "test_size": 64}},
    "defaults": {"epochs": 2, "repeats": 3},
    "bench": {"kernels": False, "comm": False, "floor": False},
    "resources": {"runtime_min": 2},
    "cluster": {"minutes_per_job": 4, "cell_minutes": 1},
    "sweeps": [
        {"name": "s", "dataset": "synthetic", "model": "lenet", "grid": {"mode": ["single"], "batch": [32, 64]}},
        {"name": "e", "dataset": "synthetic", "model": "lenet", "grid": {"mode": ["single"], "batch": [128]}},
    ],
}


def study(config=STUDY, **cluster):
    config = copy.deepcopy(config)
    config["cluster"].update(cluster)
    return load_study(config, user_check=None, visible_gpus=0, capabilities=(), host_cores=2)


def write_record(cell, total_s: float, startup_s: float, status: str = "ok", epochs: int | None = None):
    spec = dict(cell.spec, epochs=epochs or cell.spec["epochs"])
    rec = record.make(cell.id, status, None if status == "ok" else "why", spec, {}, summary={"total_s": total_s})
    rec["summary"]["startup_s"] = startup_s
    os.makedirs(outputs.cell_dir(cell.id), exist_ok=True)
    with open(outputs.record_path(cell.id), "w") as f:
        json.dump(rec, f)


def test_estimates_come_from_the_setting_then_its_other_epochs_then_the_guess(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = study()
    by_id = {c.id: c for c in s.cells}
    b32 = [c for c in s.cells if "-b32-" in c.id]
    b64 = [c for c in s.cells if "-b64-" in c.id]
    write_record(b32[0], total_s=30, startup_s=6)  # its repeats take it
    write_record(b64[1], total_s=99, startup_s=9, status="failed")  # a failed record measures nothing
    got = estimates.estimates(s.cells, 1.0, lambda cell: True)
    assert {got[c.id].source for c in b32} == {"setting"}
    assert got[b32[2].id].seconds == pytest.approx(30 + estimates.LAUNCH_S)
    assert {got[c.id].source for c in b64} == {"guess"} and got[b64[0].id].seconds == 60
    # the setting at other epochs: start-up plus training scaled to this cell's 2 epochs
    other = copy.deepcopy(STUDY)
    other["defaults"]["epochs"] = 4
    four = study(other)
    write_record(next(c for c in four.cells if "-b128-" in c.id), total_s=46, startup_s=6)
    b128 = next(c for c in s.cells if "-b128-" in c.id)
    again = estimates.estimates([by_id[b128.id]], 1.0, lambda cell: True)[b128.id]
    assert again.source == "epochs" and again.seconds == pytest.approx(6 + 40 * 2 / 4 + estimates.LAUNCH_S)
    assert estimates.estimates([b128], 1.0, lambda cell: False)[b128.id].source == "skipped"


def test_a_packing_run_gives_packed_cells_a_slot_and_a_minute_and_leaves_the_rest_alone(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = study()  # 9 one-minute cells, jobs of 4 minutes: 3 packs
    made = s.submission
    assert made.jobs == 3 and made.minutes_per_job == 4
    assert "9 train cells in 3 jobs: 3 packs of 3 cells" in made.summary()
    cell = s.cells[0].id
    assert s.cell_resources(cell, packing=True)[submission.PACK_SLOT] == 1
    assert s.cell_resources(cell, packing=True)["runtime"] == s.cell_resources(cell)["runtime"] + 1
    assert s.cell_resources(cell)[submission.PACK_SLOT] is None  # a run that does not pack
    # a small study stays a job per cell
    alone = study(minutes_per_job=30)
    assert alone.submission.jobs == 9 and "one job each" in alone.submission.summary()
    assert alone.cell_resources(cell, packing=True)[submission.PACK_SLOT] is None


def test_the_studys_limit_and_the_sites_pack_more_cells_per_job(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    limited = study(minutes_per_job=30, max_jobs=2)
    assert limited.submission.jobs <= 2 and "at most 2 jobs (cluster.max_jobs)" in limited.submission.summary()
    s = study()
    site = submission.plan(s.cells, s.config["cluster"], s.estimates, (1, "MaxSubmitJobs of your SLURM association"))
    assert site.jobs == 1 and "at most 1 job (MaxSubmitJobs" in site.summary()
    assert study(minutes_per_job=None).submission.jobs == 9
    # without minutes_per_job: a job per cell where the limit allows it, packs only where it does not
    unpacked = submission.plan(s.cells, {**s.config["cluster"], "minutes_per_job": None}, s.estimates, (10, "site"))
    assert unpacked.jobs == 9 and unpacked.summary() == (
        "9 train cells, one job each (no pack: see cluster.minutes_per_job); at most 10 jobs (site)"
    )
    squeezed = submission.plan(s.cells, {**s.config["cluster"], "minutes_per_job": None}, s.estimates, (4, "site"))
    assert squeezed.jobs <= 4 and len(packing.groups(squeezed.groups)) >= 2


def test_the_sites_limits_are_read_from_slurm_where_it_tells_them(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, out in {
        "sacctmgr": "300\n",
        "scontrol": "MaxArraySize            = 1001\nMaxJobCount             = 10000\n",
    }.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\nprintf '{out}'\n")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    assert submission.site_limit() == (300, "MaxSubmitJobs of your SLURM association")
    (bin_dir / "sacctmgr").unlink()
    assert submission.site_limit() == (10000, "the SLURM controller's MaxJobCount")
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    assert submission.site_limit() is None


def test_each_job_reads_back_its_pack_and_estimate_and_other_cells_keep_theirs(tmp_path):
    path = str(tmp_path / "plan" / "cells.json")
    first = {"a": estimates.Estimate(61.0, "guess"), "b": estimates.Estimate(12.5, "setting")}
    plan_file.write(estimates.plan_entries(first, {"a": "pack-1n-0", "b": None}), path)
    plan_file.write(estimates.plan_entries({"b": estimates.Estimate(20.0, "setting")}, None), path)
    assert plan_file.read("a", path) == {"pack": "pack-1n-0", "estimate_s": 61.0, "source": "guess"}
    assert plan_file.read("b", path) == {"pack": None, "estimate_s": 20.0, "source": "setting"}
    assert plan_file.read("c", path) == {} and plan_file.read("a", str(tmp_path / "none")) == {}


def test_a_packing_run_without_the_profiles_other_settings_names_them():
    components = {submission.PACK_GROUP: 100000}
    assert submission.missing_profile_settings(components, {submission.PACK_SLOT: 1}, {submission.PACK_SLOT}) == []
    missing = submission.missing_profile_settings(components, {"gpu": 8}, set())
    assert missing == list(submission.PROFILE_SETTINGS[1:])
    assert submission.missing_profile_settings({}, {}, set()) == []  # no packing asked for
