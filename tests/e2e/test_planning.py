"""What the workflow plans from a study, before any job: every shipped study plans, the stand-in
switch keeps a source grid on generated data, bad configs fail naming the key, cells beyond the
GPU budget are left out with one warning, and a cell skipped before torch starts takes one core.

Planning is dpstudy.workflow.planning.load_study, which rules/common.smk calls: the checks of what
it decides run in process (tests/unit/workflow/test_load_study.py, and here); real `snakemake -n`
runs prove the wiring (a ConfigError is Snakemake's "invalid study config" before any job; the
configs it merges are the ones planned here; the DAG builds)."""

from __future__ import annotations

import copy
import re

import pytest
import yaml
from helpers import REPO
from helpers.workflow import copy_checkout, dry_run, planned, snakemake
from snakemake.utils import update_config

from dpstudy.jobs.gpus import visible_gpu_count
from dpstudy.util import allocator
from dpstudy.util.errors import ConfigError
from dpstudy.workflow.planning import load_study

STUDIES = ["config.yaml", *sorted(f"studies/{p.name}" for p in (REPO / "config/studies").glob("*.yaml"))]
SOURCE_STUDIES = sorted(f"studies/{p.name}" for p in (REPO / "config/studies").glob("s00*.yaml"))
SMALL = {
    "study": "workflow_test",
    "datasets": {"synthetic": {"train_size": 512, "test_size": 128}},
    "defaults": {"epochs": 1},
    "bench": {"kernels": False, "comm": False},
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


def merged(*files: str) -> dict:
    """The config Snakemake reads from `--configfile FILE...`: each file merged into the ones before."""
    config: dict = {}
    for name in files:
        update_config(config, yaml.safe_load((REPO / name).read_text()))
    return config


def cell_ids(*files: str) -> list[str]:
    config = merged(*files)
    study = load_study(config, [str(REPO / files[0])], user_check=None, visible_gpus=0, capabilities=[])
    return [c.id for c in study.cells]


@pytest.fixture
def checkout(tmp_path):
    return copy_checkout(tmp_path)


@pytest.mark.parametrize("study", STUDIES)
def test_every_study_plans(study):
    cells = cell_ids(f"config/{study}")
    assert cells and len(set(cells)) == len(cells)


@pytest.mark.parametrize("study", SOURCE_STUDIES)
def test_the_stand_in_switch_keeps_a_source_grid_on_generated_data(study):
    real = cell_ids(f"config/{study}")
    stand_in = cell_ids(f"config/{study}", "config/stand_in.yaml")
    assert len(stand_in) == len(real)
    assert {cell.split("-", 1)[1] for cell in stand_in} == {cell.split("-", 1)[1] for cell in real}  # the same grid
    assert all(cell.startswith("synthetic") for cell in stand_in)


@pytest.mark.slow
@pytest.mark.parametrize("study", ["studies/strategies.yaml", "studies/multinode_scaling.yaml"])
def test_snakemake_builds_the_dag_of_a_study(checkout, study):
    jobs = dry_run(checkout, None, "--configfile", f"config/{study}")
    assert set(jobs["train"]) == set(cell_ids(f"config/{study}")) and "report" in jobs


@pytest.mark.slow
def test_snakemake_plans_a_source_study_on_stand_ins_as_planned_here(checkout):
    files = ("config/studies/s004_stl10_ddp.yaml", "config/stand_in.yaml")
    jobs = dry_run(checkout, None, "--configfile", *files)
    assert set(jobs["train"]) == set(cell_ids(*files)) and "report" in jobs


def bad(config_change) -> dict:
    config = copy.deepcopy(SMALL)
    config_change(config)
    return config


BAD_CONFIGS = [
    (lambda c: c.update(colour="red"), "unknown key 'colour'"),
    (lambda c: c["sweeps"][0].update(dataset="imagenet"), "sweep 'alpha': dataset 'imagenet'"),
    (lambda c: c["sweeps"][0]["grid"].update(optimizer=["lbfgs"]), "sweep 'alpha': optimizer: 'lbfgs' is not one of"),
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
    (lambda c: c.update(allocator="mimalloc"), "allocator: 'mimalloc' is not one of"),
]


@pytest.mark.parametrize("change, message", BAD_CONFIGS)
def test_bad_configs_are_refused_naming_the_key(change, message):
    with pytest.raises(ConfigError) as refused:
        load_study(bad(change), user_check=None, visible_gpus=0, capabilities=[])
    assert message in str(refused.value)


def test_an_allocator_this_host_lacks_is_refused_before_any_job(monkeypatch):
    monkeypatch.setattr(allocator, "find_library", lambda name: None)  # a host without jemalloc or tcmalloc
    for name, package in (("jemalloc", "libjemalloc2"), ("tcmalloc", "libtcmalloc-minimal4")):
        with pytest.raises(ConfigError) as refused:
            load_study({**SMALL, "allocator": name}, user_check=None, visible_gpus=0, capabilities=[])
        message = str(refused.value)
        assert f"allocator: '{name}': no lib{name}" in message and f"apt-get install {package}" in message
        assert "choose auto, glibc or system" in message
    # auto, glibc and system need no library
    assert load_study({**SMALL, "allocator": "auto"}, user_check=None, visible_gpus=0, capabilities=[]).allocator == (
        allocator.Setup("glibc", variables=allocator.GLIBC_KEEP)
    )


@pytest.mark.slow
def test_a_bad_config_fails_the_workflow_before_any_job(checkout):
    change, message = BAD_CONFIGS[4]
    proc = snakemake(checkout, "-n", config=bad(change), check=False)
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    assert message in output and "invalid study config" in output
    assert "rule train" not in output and not (checkout / "results" / "cells").exists()


@pytest.mark.slow
def test_cells_beyond_the_gpu_budget_are_left_out_with_one_warning(checkout):
    config = {**SMALL, "device": "cuda"}
    proc = snakemake(checkout, "-n", "--resources", "gpu=1", config=config)
    output = proc.stdout + proc.stderr
    assert output.count("need more GPUs than --resources gpu allows") == 1
    assert "synthetic-lenet-ddp-g2-b64-gloo" in output
    assert set(planned(proc)["train"]) == ALPHA - {"synthetic-lenet-ddp-g2-b64-gloo"} | BETA


@pytest.mark.slow
def test_the_collectives_are_planned_at_each_world_size_run_or_forecast_within_the_gpu_budget(checkout):
    config = {
        **SMALL,
        "device": "cuda",
        "bench": {"kernels": False, "comm": True},
        "forecast": [{"mode": ["ddp"], "gpus": [4, 8], "batch": [64], "backend": ["nccl"]}],
    }
    proc = snakemake(checkout, "-n", "-p", "results/bench/comm.csv", "--resources", "gpu=4", config=config)
    (command,) = re.findall(r"^Shell command: (.*scripts/comm_bench\.py.*)$", proc.stdout, re.M)
    visible = visible_gpu_count()
    held = min(visible, 4) if visible else 4  # a GPU-less planning host: the --resources budget
    sizes = [n for n in (2, 4) if n == 2 or n <= held]  # the cells' 2, forecast's 4; 8 is past the budget
    assert f"--world-sizes {' '.join(map(str, sizes))} " in command
    assert f"--gpus {max(sizes) if not visible else min(max(sizes), visible)} " in command


@pytest.mark.slow
@pytest.mark.skipif(visible_gpu_count() > 0, reason="on a GPU host DP and NCCL cells run")
def test_a_cell_skipped_before_torch_starts_takes_one_core_and_a_timed_cell_the_machine(checkout):
    # the default study on this CPU host: DP and NCCL cells are skipped by their launcher
    proc = snakemake(checkout, "-n", "--cores", "2")
    assert set(planned(proc)["train"]) == set(cell_ids("config/config.yaml")) and "report" in planned(proc)
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
