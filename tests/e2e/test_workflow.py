"""The Snakemake workflow, run for real: dry runs, a full run of a small study, and reruns."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from helpers.browser import open_offline
from helpers.workflow import (
    REPO,
    copy_checkout,
    dry_run,
    processes_with,
    snakemake,
    start_snakemake,
    wait_for_text,
    wait_until_gone,
)

from dpstudy.jobs.gpus import visible_gpu_count
from dpstudy.record import provenance
from dpstudy.report import sources
from dpstudy.study import outputs

AGGREGATIONS = {"collect", "figures", "report", "all"}
# the report shows the resolved study; the memory plan predicts the study's cells
CONFIG_CHANGED = AGGREGATIONS | {"study_config", "memory_plan"}
# Training code also makes the memory plan's prediction (its own Trainer on fake tensors)
PLANNED = AGGREGATIONS | {"memory_plan"}
SMALL = {
    "study": "workflow_test",
    "datasets": {"synthetic": {"train_size": 512, "test_size": 128}},
    "defaults": {"epochs": 1},
    "bench": {"kernels": False, "comm": False},  # the default-study test covers them
    "sweeps": [
        {
            "name": "alpha",
            "dataset": "synthetic",
            "model": "lenet",
            "grid": {"mode": ["single", "ddp"], "gpus": [1, 2], "batch": [64], "backend": ["gloo"]},
        },
        {"name": "beta", "dataset": "synthetic", "model": "lenet", "grid": {"mode": ["single"], "batch": [32]}},
    ],
}
ALPHA = {"synthetic-lenet-single-g1-b64-none", "synthetic-lenet-ddp-g1-b64-gloo", "synthetic-lenet-ddp-g2-b64-gloo"}
BETA = {"synthetic-lenet-single-g1-b32-none"}


@pytest.fixture
def checkout(tmp_path) -> Path:
    return copy_checkout(tmp_path)


STUDIES = ["config.yaml", *sorted(f"studies/{p.name}" for p in (REPO / "config/studies").glob("*.yaml"))]
SOURCE_STUDIES = sorted(f"studies/{p.name}" for p in (REPO / "config/studies").glob("s00*.yaml"))


@pytest.mark.parametrize("study", STUDIES)
def test_every_study_dry_runs(checkout, study):
    jobs = dry_run(checkout, None, "--configfile", f"config/{study}")
    assert jobs["train"] and "report" in jobs


@pytest.mark.skipif(visible_gpu_count() > 0, reason="on a GPU host DP and NCCL cells run")
def test_a_cell_skipped_before_torch_starts_takes_one_core_and_a_timed_cell_the_machine(checkout):
    # the default study on this CPU host: DP and NCCL cells are skipped by their launcher
    proc = snakemake(checkout, "-n", "--cores", "2")
    threads = {}
    for block in re.split(r"\n(?=\[)", proc.stdout + proc.stderr):  # a job's block opens with [date]
        cell = re.search(r"wildcards: cell=(\S+)", block)
        if cell and re.search(r"^(local)?rule train:", block.strip(), re.M):
            count = re.search(r"^\s*threads: (\d+)", block, re.M)
            threads[cell.group(1)] = int(count.group(1)) if count else 1  # Snakemake omits 1
    skipped = {c for c in threads if "-dp-" in c or "-nccl" in c}
    assert skipped and len(skipped) < len(threads)
    assert {threads[c] for c in skipped} == {1}  # nothing to measure: it may share the machine
    assert {t for c, t in threads.items() if c not in skipped} == {2}  # the whole machine


@pytest.mark.parametrize("study", SOURCE_STUDIES)
def test_the_stand_in_switch_keeps_a_source_grid_on_generated_data(checkout, study):
    real = dry_run(checkout, None, "--configfile", f"config/{study}")
    stand_in = dry_run(checkout, None, "--configfile", f"config/{study}", "config/stand_in.yaml")
    assert len(stand_in["train"]) == len(real["train"])
    renamed = {cell.split("-", 1)[1] for cell in real["train"]}
    assert {cell.split("-", 1)[1] for cell in stand_in["train"]} == renamed  # the same grid
    assert all(cell.startswith("synthetic") for cell in stand_in["train"])


def bad(config_change) -> dict:
    config = copy.deepcopy(SMALL)
    config_change(config)
    return config


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda c: c.update(colour="red"), "unknown key 'colour'"),
        (lambda c: c["sweeps"][0].update(dataset="imagenet"), "sweep 'alpha': dataset 'imagenet'"),
        (
            lambda c: c["sweeps"][0]["grid"].update(optimizer=["lbfgs"]),
            "sweep 'alpha': optimizer: 'lbfgs' is not one of",
        ),
        (lambda c: c["sweeps"][0]["grid"].update(batch=[63]), "sweep 'alpha': batch 63 is not divisible by gpus 2"),
        (
            lambda c: c["sweeps"][1].update(name="beta; rm -rf /"),
            "sweep 'beta; rm -rf /': name: 'beta; rm -rf /' does not match",
        ),
        (lambda c: c["sweeps"][0].update(colour=1), "sweep 'alpha': unknown key 'colour'"),
        (
            lambda c: c["sweeps"][0].update(set={"optimizer": "lbfgs"}),
            "sweep 'alpha': set.optimizer: 'lbfgs' is not one of",
        ),
        (lambda c: c["sweeps"][0]["grid"].update(colour=[1]), "sweep 'alpha': unknown grid key 'colour'"),
        (lambda c: c["sweeps"][1].update(name="alpha"), "sweep name 'alpha' is used more than once"),
    ],
)
def test_bad_configs_fail_before_any_job(checkout, change, message):
    proc = snakemake(checkout, "-n", config=bad(change), check=False)
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    assert message in output and "invalid study config" in output
    assert "rule train" not in output and not (checkout / "results" / "cells").exists()


def test_cells_beyond_the_gpu_budget_are_left_out_with_one_warning(checkout):
    config = {**SMALL, "device": "cuda"}
    proc = snakemake(checkout, "-n", "--resources", "gpu=1", config=config)
    output = proc.stdout + proc.stderr
    assert output.count("need more GPUs than --resources gpu allows") == 1
    assert "synthetic-lenet-ddp-g2-b64-gloo" in output
    from helpers.workflow import planned

    assert set(planned(proc)["train"]) == ALPHA - {"synthetic-lenet-ddp-g2-b64-gloo"} | BETA


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A complete run of the small study, shared by the rerun tests (they only dry-run)."""
    workdir = copy_checkout(tmp_path_factory.mktemp("finished"))
    snakemake(workdir, "--cores", "2", "--resources", "gpu=2", config=SMALL)
    return workdir


@pytest.mark.slow
def test_small_study_runs_to_the_report(finished):
    cells = pd.read_csv(finished / "results/tables/cells.csv")
    assert set(cells["cell"]) == ALPHA | BETA
    assert (cells["status"] == "ok").all()
    ddp2 = cells.set_index("cell").loc["synthetic-lenet-ddp-g2-b64-gloo"]
    assert ddp2["baseline"] == "synthetic-lenet-single-g1-b64-none" and ddp2["speedup"] > 0
    html = (finished / "results/report/report.html").read_text()
    assert "workflow_test" in html and "data:image/png;base64" in html
    for cell in ALPHA | BETA:
        assert (finished / f"results/cells/{cell}/train.log").stat().st_size > 0
        assert (finished / f"results/cells/{cell}/benchmark.tsv").exists()
    # every cell's memory, predicted on the planning host (first by priority, not ordered before
    # training unless the study sets memory_budget_gib), beside what its step measured
    split = pd.read_csv(finished / "results/tables/memory_split.csv")
    assert len(split) == 5 and set(split["cell"]) == ALPHA | BETA  # ddp g2: two ranks
    assert split["error_pct"].abs().max() <= 15 and split["predicted_peak_mb"].gt(0).all()
    assert dry_run(finished, SMALL) == {}  # nothing left to do


@pytest.mark.slow
def test_a_cell_predicted_not_to_fit_the_memory_budget_is_skipped_and_a_new_budget_reruns_no_cell(checkout):
    one = {**SMALL, "sweeps": [SMALL["sweeps"][1]], "memory_budget_gib": 0.001}  # LeNet at batch 32: ~3 MB
    (cell,) = BETA
    snakemake(checkout, "--cores", "1", f"results/cells/{cell}/record.json", config=one)
    rec = json.loads((checkout / f"results/cells/{cell}/record.json").read_text())
    assert rec["status"] == "skipped" and re.fullmatch(
        r"predicted 0\.00 GiB > 0\.001 GiB per device \(study memory_budget_gib, memory plan\)", rec["reason"]
    )
    assert "running:" not in (checkout / f"results/cells/{cell}/train.log").read_text()  # never launched
    jobs = dry_run(checkout, {**one, "memory_budget_gib": 8}, f"results/cells/{cell}/record.json")
    assert set(jobs) == {"study_config", "memory_plan"}  # re-predicted; the record stands (see docs)


@pytest.mark.slow
def test_changing_one_sweep_reruns_only_its_cells(finished):
    config = copy.deepcopy(SMALL)
    config["sweeps"][0]["grid"]["backend"] = ["gloo"]  # unchanged
    config["defaults"] = {"epochs": 1}
    changed = copy.deepcopy(config)
    changed["sweeps"][1]["set"] = {"lr": 0.1}
    jobs = dry_run(finished, changed)
    assert set(jobs["train"]) == {"synthetic-lenet-single-g1-b32-none-lr0p1"}
    assert set(jobs) == {"train"} | CONFIG_CHANGED


@pytest.mark.slow
def test_changing_a_default_reruns_every_cell_through_params(finished):
    changed = {**SMALL, "defaults": {"epochs": 2}}
    jobs = dry_run(finished, changed)
    assert set(jobs["train"]) == ALPHA | BETA  # same ids, new params


@pytest.mark.slow
def test_adding_a_cell_schedules_only_it(finished):
    changed = copy.deepcopy(SMALL)
    changed["sweeps"][1]["grid"]["batch"] = [32, 128]
    jobs = dry_run(finished, changed)
    assert jobs["train"] == ["synthetic-lenet-single-g1-b128-none"]
    assert set(jobs) == {"train"} | CONFIG_CHANGED


@pytest.mark.slow
def test_deleting_one_record_reruns_only_that_cell(finished, tmp_path):
    record = finished / "results/cells/synthetic-lenet-ddp-g1-b64-gloo/record.json"
    saved = tmp_path / "record.json"
    saved.write_bytes(record.read_bytes())
    record.unlink()
    try:
        jobs = dry_run(finished, SMALL)
    finally:
        record.write_bytes(saved.read_bytes())
    assert jobs["train"] == ["synthetic-lenet-ddp-g1-b64-gloo"]
    assert set(jobs) == {"train"} | AGGREGATIONS


@contextlib.contextmanager
def edited(path: Path):
    """`path` with a harmless edit for the duration of the block."""
    original = path.read_text()
    path.write_text(original + "\n# an edit\n")
    try:
        yield
    finally:
        path.write_text(original)


@pytest.mark.slow
@pytest.mark.parametrize(
    "module, rules",
    [
        # Training code (the modules that decide a record's numbers): the tables are redone, so that
        # they flag the cells as stale, and no cell reruns.
        ("dpstudy/engine/outcome.py", PLANNED),
        ("dpstudy/engine/monitor.py", PLANNED),
        ("dpstudy/data/store.py", PLANNED),
        # Aggregation and report code: only the rules that run it.
        ("dpstudy/analysis/stats.py", AGGREGATIONS),
        ("dpstudy/report/figures/layout.py", {"figures", "report", "all"}),
        ("dpstudy/report/text.py", {"figures", "report", "all"}),
        ("dpstudy/report/findings/scaling.py", {"report", "all"}),
    ],
)
def test_an_edit_reruns_exactly_the_rules_that_run_the_code(finished, module, rules):
    with edited(finished / module):
        jobs = dry_run(finished, SMALL)
    assert set(jobs) == rules


@pytest.mark.slow
def test_editing_training_code_flags_cells_instead_of_rerunning(finished):
    with edited(finished / "dpstudy/engine/train.py"):
        jobs = dry_run(finished, SMALL)
        assert "train" not in jobs and {"collect", "report"} <= set(jobs)
        snakemake(finished, "--cores", "2", "--resources", "gpu=2", "--until", "collect", config=SMALL)
        stale = (finished / "results/tables/stale.txt").read_text().split()
        assert len(stale) == len(ALPHA | BETA)
        # The README's command reruns exactly those cells.
        rerun = dry_run(finished, SMALL, "--forcerun", *stale)
        assert set(rerun["train"]) == ALPHA | BETA


@pytest.mark.slow
def test_default_study_runs_end_to_end_on_cpu(tmp_path):
    """`make run` on this machine: DDP over Gloo with 1 and 2 processes, DP and NCCL skipped, three
    repeats of each, accuracy equal across modes, and a report that renders offline. The workflow
    runs against dpstudy installed with `pip install .` (not editable): a workflow folder without
    the package, every job importing it from site-packages."""
    workdir, site = installed_workflow(tmp_path)
    snakemake(workdir, "--cores", "2", "--resources", "gpu=2", timeout=900, env={"PYTHONPATH": str(site)})
    cells = pd.read_csv(workdir / "results/tables/cells.csv").set_index("cell")
    assert set(cells["source_hash"]) == {provenance.source_hash()}  # the same code, wherever it lies
    ran = cells[cells["status"] == "ok"]
    ddp = ran[ran["mode"] == "ddp"]
    assert set(zip(ddp["gpus"], ddp["batch"], ddp["backend"])) == {
        (1, 64, "gloo"),
        (2, 64, "gloo"),
        (1, 256, "gloo"),
        (2, 256, "gloo"),
    }
    assert (ran["final_test_acc"] > 0.9).all() and (ddp["speedup"] > 0).all()
    assert sorted(ran["repeat"].unique()) == [0, 1, 2]
    skipped = cells[cells["status"] == "skipped"]
    assert set(skipped["mode"]) == {"dp", "ddp"} and set(skipped[skipped["mode"] == "ddp"]["backend"]) == {"nccl"}
    settings = pd.read_csv(workdir / "results/tables/settings.csv")
    spread = settings.groupby("batch")["final_test_acc"].agg(lambda a: a.max() - a.min())
    assert (spread < 0.01).all(), f"accuracy differs across modes by {spread.to_dict()}"
    assert (settings["repeats"] == 3).all() and settings["speedup_low"].notna().any()
    assert len(pd.read_csv(workdir / "results/tables/scaling.csv")) == 6  # ddp g2 x 2 batches x 3 repeats
    # the memory plan against every finished cell's tracked step: the target, 15 %
    accuracy = pd.read_csv(workdir / "results/tables/memory_accuracy.csv").set_index("mode")
    assert accuracy.loc["all", "devices"] == 24  # single, ddp g1: 6 cells each; ddp g2: 6 cells x 2 ranks
    assert accuracy.loc["all", "within_target"], accuracy.to_dict()
    html = (workdir / "results/report/report.html").read_text()
    assert "DDP (gloo) on 2 devices at batch 64: " in html and "Largest loss: <strong>" in html
    assert "mode dp needs CUDA" in html and "backend nccl needs CUDA" in html
    page = open_offline(workdir / "results/report/report.html")
    figures = sorted(p.name for p in (workdir / "results/figures").glob("*.png"))
    # every figure of outputs.FIGURES and the two microbenchmarks', each shown in the report
    assert figures == sorted([*outputs.FIGURES, "comm.png", "kernels.png"])
    assert page["blocked"] == [] and len(page["images"]) == len(figures) == 14
    assert all(done and width > 100 for done, width in page["images"])


def installed_workflow(tmp_path: Path) -> tuple[Path, Path]:
    """(a workflow folder without dpstudy/, a site folder with dpstudy installed from a copy)."""
    source = copy_checkout(tmp_path / "source")
    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(site),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    workdir = tmp_path / "workflow"
    shutil.copytree(source, workdir, ignore=lambda folder, names: ["dpstudy"] if Path(folder) == source else [])
    where = subprocess.run(
        [sys.executable, "-c", "import dpstudy; print(dpstudy.__file__)"],
        cwd=workdir,
        text=True,
        env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True,
        check=True,
    ).stdout
    assert Path(where.strip()).is_relative_to(site)
    return workdir, site


LONG = "synthetic-lenet-ddp-g2-b8-gloo-epochs60"
WITH_LONG = {
    **SMALL,
    "sweeps": [
        *SMALL["sweeps"],
        {
            "name": "long",
            "dataset": "synthetic",
            "model": "lenet",
            "grid": {"mode": ["ddp"], "gpus": [2], "batch": [8], "backend": ["gloo"]},
            "set": {"epochs": 60},
        },
    ],
}


@pytest.fixture
def running_long_cell(finished, tmp_path):
    """A copy of the finished study, running one more cell (DDP over 2 ranks) in the background:
    (workdir, snakemake process, the ranks' pids)."""
    workdir = tmp_path / "study"
    shutil.copytree(finished, workdir, symlinks=True)
    # Bring the copy's tables up to date first (earlier tests edit code and flag cells stale).
    snakemake(workdir, "--cores", "2", "--resources", "gpu=2", config=SMALL)
    proc = start_snakemake(workdir, "--cores", "2", "--resources", "gpu=2", config=WITH_LONG)
    try:
        wait_for_text(workdir / f"results/cells/{LONG}/train.log", "epoch 1/", proc)
        ranks = processes_with(f"--out results/cells/{LONG} --cell")
        ranks = [
            pid
            for pid in ranks
            if "dpstudy.engine" in Path(f"/proc/{pid}/cmdline").read_text() and not is_torchrun(pid)
        ]
        assert len(ranks) == 2
        yield workdir, proc, ranks
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        wait_until_gone(processes_with(f"results/cells/{LONG}"), 10)


def is_torchrun(pid: int) -> bool:
    """The launcher's torchrun: the script, or `python -m torch.distributed.run` (a host's torch)."""
    cmdline = Path(f"/proc/{pid}/cmdline").read_text()
    return "torchrun" in cmdline or "torch.distributed.run" in cmdline


@pytest.mark.slow
def test_killing_snakemake_and_torchrun_takes_the_ranks_along(running_long_cell):
    workdir, proc, ranks = running_long_cell
    torchrun = [p for p in processes_with(f"results/cells/{LONG}") if is_torchrun(p)]
    os.kill(proc.pid, signal.SIGKILL)
    for pid in torchrun:
        os.kill(pid, signal.SIGKILL)
    assert wait_until_gone(ranks, 5) == [], "ranks kept training after their launcher was killed"
    assert wait_until_gone(processes_with(f"results/cells/{LONG}"), 5) == []
    time.sleep(2)
    assert not (workdir / f"results/cells/{LONG}/record.json").exists()


@pytest.mark.slow
def test_a_killed_job_leaves_no_record_and_the_rerun_runs_just_it(running_long_cell):
    workdir, proc, ranks = running_long_cell
    tables_before = pd.read_csv(workdir / "results/tables/cells.csv").set_index("cell")
    records_before = {c: (workdir / f"results/cells/{c}/record.json").read_bytes() for c in ALPHA | BETA}
    os.killpg(proc.pid, signal.SIGKILL)  # the job's process group: snakemake, the launcher, torchrun
    assert wait_until_gone(ranks, 5) == [], "ranks kept training after their process group was killed"
    time.sleep(2)
    assert not (workdir / f"results/cells/{LONG}/record.json").exists()
    assert {c: (workdir / f"results/cells/{c}/record.json").read_bytes() for c in ALPHA | BETA} == records_before
    snakemake(workdir, "--unlock", config=WITH_LONG)  # a killed Snakemake leaves its lock behind
    assert dry_run(workdir, WITH_LONG)["train"] == [LONG]
    snakemake(workdir, "--cores", "2", "--resources", "gpu=2", config=WITH_LONG)
    tables_after = pd.read_csv(workdir / "results/tables/cells.csv").set_index("cell")
    assert tables_after.loc[LONG, "status"] == "ok"
    pd.testing.assert_frame_equal(tables_after.loc[tables_before.index], tables_before)


@pytest.mark.slow
def test_a_source_study_on_stand_in_data_reports_side_by_side(tmp_path):
    """s004 on this CPU with generated data (tiny here): its report sets the source's figures
    beside ours and says which findings hold and which cells cannot run here."""
    workdir = copy_checkout(tmp_path)
    (workdir / "config/tiny.yaml").write_text("datasets: {synthetic_stl: {train_size: 64, test_size: 32}}\n")
    snakemake(
        workdir,
        "--cores",
        "2",
        "--resources",
        "gpu=2",
        "--configfile",
        "config/studies/s004_stl10_ddp.yaml",
        "config/stand_in.yaml",
        "config/tiny.yaml",
        timeout=900,
    )
    html = (workdir / "results/report/report.html").read_text()
    assert "Source 004: University of Tehran" in html and "generated stand-ins" in html
    assert "DDP on 2 GPUs (gloo for nccl):" in html  # NCCL cannot run here; the study's Gloo cell stands in
    assert "cannot tell: cannot run here: backend nccl needs CUDA GPUs" in html
    questions = [c["question"] for c in sources.sources()["s004_stl10_ddp"]["comparisons"]]
    assert len(questions) == 6
    for question in questions:  # every comparison of sources.yaml for s004 has its row
        assert html.count(f"<td>{question}</td>") == 1, question
