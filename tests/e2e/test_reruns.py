"""After a change only what it touched reruns, and nothing half-made is ever taken for a result:
changes of the session's default study (tests/e2e/conftest.py) dry-run against it; what runs jobs
(stale flags, killed jobs) works on a copy of it."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import signal
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from helpers import REPO
from helpers.workflow import (
    copy_checkout,
    dry_run,
    processes_with,
    progress,
    snakemake,
    start_snakemake,
    wait_for_text,
    wait_until_gone,
)

from dpstudy.workflow.planning import load_study

pytestmark = pytest.mark.slow

AGGREGATIONS = {"collect", "figures", "report", "all"}
# the report shows the resolved study; the memory plan predicts the study's cells
CONFIG_CHANGED = AGGREGATIONS | {"study_config", "memory_plan"}
# Training code also makes the memory plan's prediction (its own Trainer on fake tensors)
PLANNED = AGGREGATIONS | {"memory_plan"}
DEFAULT = yaml.safe_load((REPO / "config/config.yaml").read_text())


def cell_ids(config: dict, sweep: str | None = None) -> set[str]:
    """The cells the workflow plans for `config` (of one sweep), planned in process."""
    cells = load_study(config, user_check=None, visible_gpus=0, capabilities=[]).cells
    return {cell.id for cell in cells if sweep is None or cell.sweep == sweep}


def with_sweeps(*sweeps: dict) -> dict:
    return {**copy.deepcopy(DEFAULT), "sweeps": list(sweeps)}


MODES = DEFAULT["sweeps"][0]
ALL = cell_ids(DEFAULT)


def test_the_default_studys_cells_are_what_planning_names(default_study):
    assert {p.parent.name for p in (default_study.workdir / "results/cells").glob("*/record.json")} == ALL
    assert len(ALL) == 42  # single g1, dp g1/g2, ddp g1/g2 x nccl/gloo: 7 settings at 2 batches, 3 repeats


def test_splitting_a_sweep_reruns_nothing_and_changing_one_reruns_only_its_cells(default_study):
    by_batch = with_sweeps(
        *({**MODES, "name": f"b{b}", "grid": {**MODES["grid"], "batch": [b]}} for b in MODES["grid"]["batch"])
    )
    assert cell_ids(by_batch) == ALL
    assert "train" not in default_study.dry_run(by_batch)  # the same cells, ids and settings
    changed = copy.deepcopy(by_batch)
    changed["sweeps"][1]["set"] = {"lr": 0.1}
    jobs = default_study.dry_run(changed)
    rerun = cell_ids(changed, "b256")
    assert set(jobs["train"]) == rerun and len(rerun) == 21 and all("-b256-" in c and "-lr0p1" in c for c in rerun)
    # every round trains cells again, so every round's floor is measured again beside them
    assert set(jobs) == {"train", "floor"} | CONFIG_CHANGED and sorted(jobs["floor"]) == ["0", "1", "2"]


def test_changing_a_default_reruns_every_cell_through_params(default_study):
    jobs = default_study.dry_run({**DEFAULT, "defaults": {**DEFAULT["defaults"], "epochs": 2}})
    assert set(jobs["train"]) == ALL  # same ids, new params


def test_adding_a_cell_schedules_only_it(default_study):
    added = with_sweeps({**MODES, "grid": {**MODES["grid"], "batch": [64, 256, 128]}})
    jobs = default_study.dry_run(added)
    new = cell_ids(added) - ALL
    assert set(jobs["train"]) == new and len(new) == 21 and all("-b128-" in c for c in new)
    assert set(jobs) == {"train", "floor"} | CONFIG_CHANGED and sorted(jobs["floor"]) == ["0", "1", "2"]


def test_deleting_one_record_reruns_only_that_cell(default_study, tmp_path):
    cell = "synthetic-lenet-ddp-g1-b64-gloo-r1"
    record = default_study.workdir / f"results/cells/{cell}/record.json"
    saved = tmp_path / "record.json"
    saved.write_bytes(record.read_bytes())
    record.unlink()
    try:
        jobs = default_study.dry_run()
    finally:
        record.write_bytes(saved.read_bytes())
    assert jobs["train"] == [cell]
    assert set(jobs) == {"train", "floor"} | AGGREGATIONS and jobs["floor"] == ["1"]  # its round's floor


@contextlib.contextmanager
def edited(path: Path):
    """`path` with a harmless edit for the duration of the block."""
    original = path.read_text()
    path.write_text(original + "\n# an edit\n")
    try:
        yield
    finally:
        path.write_text(original)


@pytest.mark.parametrize(
    "module, rules",
    [
        # Training code (the modules that decide a record's numbers): the tables are redone, so that
        # they flag the cells as stale, and no cell reruns.
        ("dpstudy/engine/outcome.py", AGGREGATIONS),  # the cell's record: not the memory plan's code
        ("dpstudy/engine/monitor.py", PLANNED | {"floor"}),  # the floor measures the other load with it
        ("dpstudy/data/store.py", PLANNED),
        # Aggregation and report code: only the rules that run it.
        ("dpstudy/analysis/stats.py", AGGREGATIONS),
        ("dpstudy/report/figures/layout.py", {"figures", "report", "all"}),
        ("dpstudy/report/text.py", {"figures", "report", "all"}),
        ("dpstudy/report/findings/speedup.py", {"report", "all"}),
    ],
)
def test_an_edit_reruns_exactly_the_rules_that_run_the_code(default_study, module, rules):
    with edited(default_study.code(module)):  # the installed package's copy: what the jobs import
        jobs = default_study.dry_run()
    assert set(jobs) == rules


def test_editing_training_code_flags_cells_instead_of_rerunning(default_study, tmp_path):
    study = default_study.copy(tmp_path)  # its tables become stale; the shared study's stay as they are
    with edited(study.code("dpstudy/engine/outcome.py")):  # training code the memory plan does not run
        jobs = study.dry_run()
        assert "train" not in jobs and {"collect", "report"} <= set(jobs)
        study.run("--cores", "2", "--resources", "gpu=2", "--until", "collect")
        stale = (study.workdir / "results/tables/stale.txt").read_text().split()
        assert sorted(stale) == sorted(f"results/cells/{c}/record.json" for c in ALL)
        # The README's command reruns exactly those cells.
        rerun = study.dry_run(None, "--forcerun", *stale)
        assert set(rerun["train"]) == ALL


# --- a job killed mid-run ------------------------------------------------------------------------

# A DDP cell over 2 ranks added to the finished study; in the runs that are killed, rank 1 stops
# answering at epoch 2 (dpstudy.engine.cell.injected_fault), so the kill finds it mid-run. Batch
# 256: the epoch each of its four killed starts waits for, and the two its rerun trains, take half
# the time they take at 64.
LONG_SWEEP = {
    "name": "long",
    "dataset": "synthetic",
    "model": "lenet",
    "grid": {"mode": ["ddp"], "gpus": [2], "batch": [256], "backend": ["gloo"]},
    "set": {"epochs": 2, "repeats": 1},
}
WITH_LONG = with_sweeps(MODES, LONG_SWEEP)
(LONG,) = cell_ids(WITH_LONG, "long")
HANG = {"DPSTUDY_INJECT_FAULT": "hang:1:2:1"}


def is_torchrun(pid: int) -> bool:
    """The launcher's torchrun (`python -m dpstudy.jobs.torchrun`)."""
    return "dpstudy.jobs.torchrun" in Path(f"/proc/{pid}/cmdline").read_text()


def start_long_cell(study) -> tuple:
    """Snakemake running the study with LONG in the background, once LONG's ranks trained an
    epoch: (the process, the ranks' pids)."""
    (study.workdir / f"results/cells/{LONG}/train.log").unlink(missing_ok=True)  # a killed attempt's
    # a Snakemake killed by SIGKILL leaves its temporary folder: in the test's folder, not in /tmp
    tmp = study.workdir.parent / "tmp"
    tmp.mkdir(exist_ok=True)
    env = {**study.env, **HANG, "TMPDIR": str(tmp)}
    proc = start_snakemake(study.workdir, "--cores", "2", "--resources", "gpu=2", config=WITH_LONG, env=env)
    try:
        watched = progress(study.workdir, study.workdir / "snakemake.out")
        wait_for_text(study.workdir / f"results/cells/{LONG}/train.log", "epoch 1/", proc, watched)
        ranks = [
            pid
            for pid in long_cell_processes(study)
            if "dpstudy.engine" in Path(f"/proc/{pid}/cmdline").read_text() and not is_torchrun(pid)
        ]
        assert len(ranks) == 2
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    return proc, ranks


def long_cell_processes(study) -> list[int]:
    """LONG's launcher, torchrun and ranks in this study's folder (not another test's)."""
    here = os.path.realpath(study.workdir)
    return [pid for pid in processes_with(f"results/cells/{LONG}") if working_folder(pid) == here]


def working_folder(pid: int) -> str | None:
    """The working folder of a live process; None for one that ended since it was listed."""
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except FileNotFoundError:
        return None


def test_a_killed_job_leaves_no_record_no_rank_and_the_rerun_runs_just_it(default_study, tmp_path):
    study = default_study.copy(tmp_path)
    records = {c: (study.workdir / f"results/cells/{c}/record.json").read_bytes() for c in ALL}
    tables_before = pd.read_csv(study.workdir / "results/tables/cells.csv").set_index("cell")
    long_record = study.workdir / f"results/cells/{LONG}/record.json"
    proc, ranks = start_long_cell(study)
    try:
        # Snakemake and the launcher's torchrun killed, each by SIGKILL: the ranks go with them.
        torchrun = [p for p in long_cell_processes(study) if is_torchrun(p)]
        os.kill(proc.pid, signal.SIGKILL)
        for pid in torchrun:
            os.kill(pid, signal.SIGKILL)
        assert wait_until_gone(ranks, 5) == [], "ranks kept training after their launcher was killed"
        assert wait_until_gone(long_cell_processes(study), 5) == []
        time.sleep(2)
        assert not long_record.exists()
        # The job's whole process group killed (snakemake, the launcher, torchrun): the same.
        study.run("--unlock", config=WITH_LONG)  # a killed Snakemake leaves its lock behind
        proc, ranks = start_long_cell(study)
        os.killpg(proc.pid, signal.SIGKILL)
        assert wait_until_gone(ranks, 5) == [], "ranks kept training after their process group was killed"
        time.sleep(2)
        assert not long_record.exists()
        # Snakemake interrupted as a terminal's Ctrl-C does (SIGINT to its process group) and as
        # `kill -- -PGID` or a service manager does (SIGTERM to the group): the launcher stops its
        # ranks and Snakemake, which waits for its running jobs, ends; no record is written.
        for stop in (signal.SIGINT, signal.SIGTERM):
            study.run("--unlock", config=WITH_LONG)
            proc, ranks = start_long_cell(study)
            os.killpg(proc.pid, stop)
            assert proc.wait(timeout=60) != 0
            assert wait_until_gone(ranks, 10) == [], f"ranks outlived Snakemake's {stop.name}"
            assert wait_until_gone(long_cell_processes(study), 10) == []
            assert not long_record.exists()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        wait_until_gone(long_cell_processes(study), 10)
    assert {c: (study.workdir / f"results/cells/{c}/record.json").read_bytes() for c in ALL} == records
    study.run("--unlock", config=WITH_LONG)
    assert study.dry_run(WITH_LONG)["train"] == [LONG]
    # up to the cells table, which is all this test reads: the figures and the report after it are
    # the default study's tests'
    study.run("results/tables/cells.csv", "--cores", "2", "--resources", "gpu=2", config=WITH_LONG)
    tables_after = pd.read_csv(study.workdir / "results/tables/cells.csv").set_index("cell")
    assert tables_after.loc[LONG, "status"] == "ok"
    # a CPU cell's MFU divides by the floor's rate, measured again with the rerun cell's round
    by_floor = ["peak_tflops", "peak_source", "mfu", "hfu", "mfu_reason"]
    pd.testing.assert_frame_equal(
        tables_after.loc[tables_before.index].drop(columns=by_floor), tables_before.drop(columns=by_floor)
    )
    ran = tables_after[tables_after["status"] == "ok"]
    assert ran["peak_tflops"].notna().all() and ran["mfu"].gt(0).all()


# --- the memory budget: a study of its own (one new cell) ----------------------------------------

ONE_CELL = {
    "study": "memory_budget_test",
    "datasets": {"synthetic": {"train_size": 512, "test_size": 128}},
    "defaults": {"epochs": 1},
    "bench": {"kernels": False, "comm": False},
    "sweeps": [{"name": "beta", "dataset": "synthetic", "model": "lenet", "grid": {"mode": ["single"], "batch": [32]}}],
}


def test_a_cell_predicted_not_to_fit_the_memory_budget_is_skipped_and_a_new_budget_reruns_no_cell(tmp_path):
    checkout = copy_checkout(tmp_path)
    one = {**ONE_CELL, "memory_budget_gib": 0.001}  # LeNet at batch 32: ~3 MB
    cell = "synthetic-lenet-single-g1-b32-none"
    snakemake(checkout, "--cores", "1", f"results/cells/{cell}/record.json", config=one)
    rec = json.loads((checkout / f"results/cells/{cell}/record.json").read_text())
    assert rec["status"] == "skipped" and re.fullmatch(
        r"predicted 1\.00 GiB \(allocator peak 0\.00 GiB \+ 10% \+ 1\.00 GiB CUDA context and workspaces\) > 0\.001 "
        r"GiB per device \(study memory_budget_gib, memory plan\)",
        rec["reason"],
    )
    assert "running:" not in (checkout / f"results/cells/{cell}/train.log").read_text()  # never launched
    jobs = dry_run(checkout, {**one, "memory_budget_gib": 8}, f"results/cells/{cell}/record.json")
    assert set(jobs) == {"study_config", "memory_plan"}  # re-predicted; the record stands (see docs)
