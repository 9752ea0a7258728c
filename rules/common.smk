# The study config -> the CELLS table, and the small helpers the rules use.
import os
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

# This checkout's dpstudy, for the workflow itself and for every job (also in --sdm conda).
sys.path.insert(0, workflow.basedir)

from dpstudy.study import outputs, predict, sweeps
from dpstudy.jobs.planning import plan
from dpstudy.record.envinfo import torch_version
from dpstudy.jobs.gpus import visible_gpu_count
from dpstudy import models
from dpstudy.data import user as user_data
from dpstudy.record.provenance import code_files, export_checkout, native_files
from dpstudy.study.resources import (
    comm_bench_gpus,
    comm_world_sizes,
    plan_gpus,
    rank_capacity,
    train_resources,
)
from dpstudy.study.spec import gap_before_start
from dpstudy.util.errors import ConfigError
from dpstudy.jobs import wakeups

export_checkout(workflow.basedir)
# Snakemake's scheduler woke ~30 times a second by the end of the default study, taking CPU from
# the timed cells (dpstudy.jobs.wakeups): one pending wake-up at a time.
wakeups.coalesce()
# Jobs run `python`: make it the interpreter Snakemake itself runs on (the venv's), also when it
# was started as .venv/bin/snakemake without the venv on PATH (else a job found another Python and
# failed with "No module named 'torch'"). A job's own conda environment, when used, comes first.
os.environ["PATH"] = os.pathsep.join(
    [str(Path(sys.executable).parent), os.environ.get("PATH", "")]
)

try:
    # The study, its cells, the user's own datasets (and the fingerprint of what preparing each
    # reads: new images or an edited function prepare it anew and rerun its cells), the check of
    # the user's models and data before any job, whether jobs reserve GPUs, the extension's build.
    PLAN = plan(config, workflow.configfiles)
except ConfigError as error:
    raise WorkflowError(f"invalid study config: {error}") from None
STUDY, ALL_CELLS, GPU_JOBS = PLAN.study, PLAN.cells, PLAN.gpu_jobs
ALL_USER_DATASETS, USER_DATA_FINGERPRINTS = PLAN.user_datasets, PLAN.fingerprints
EXT_BUILD_ARGS = PLAN.ext_build_args


# --resources gpu=N: the GPUs jobs may reserve at once (None where not given)
GPU_BUDGET = workflow.global_resources.get("gpu").value
_kept, _left_out = sweeps.within_gpu_budget(ALL_CELLS, GPU_BUDGET, GPU_JOBS)
if _left_out:
    logger.warning(
        f"{len(_left_out)} cells need more GPUs than --resources gpu allows and are left out: "
        + ", ".join(c.id for c in _left_out)
    )
CELLS = {cell.id: cell for cell in _kept}
# Repeats interleaved across settings (dpstudy.study.sweeps.run_priorities).
PRIORITIES = sweeps.run_priorities(CELLS.values())
# The jobs that measure nothing and that cells or benchmarks wait for (the data's preparation,
# the resolved study and the memory plan it feeds, the extension's build) run first, side by
# side on one core each, before the timed cells take the machine: left at priority 0, the build
# started only when the last skipped cell freed a core, and every timed cell then waited the
# 37 s of its compile on an idle core (the default study).
BEFORE_CELLS = max(PRIORITIES.values(), default=0) + 1
RECORDS = [outputs.record_path(cell) for cell in CELLS]
# The machine's floor: one run per repeat round (none with fewer than two rounds).
FLOOR_ROUNDS = (
    sweeps.floor_rounds(CELLS.values(), PRIORITIES) if STUDY["bench"]["floor"] else {}
)
FLOOR_FILES = [outputs.floor_path(repeat) for repeat in FLOOR_ROUNDS]
# The collectives' world sizes: what the cells run and predict: asks for, as far as this host holds.
COMM_WORLD_SIZES = comm_world_sizes(
    [c.spec for c in CELLS.values()],
    [request["gpus"] for request in predict.requests(STUDY)],
    rank_capacity(
        GPU_JOBS,
        visible_gpu_count(),
        GPU_BUDGET,
        len(os.sched_getaffinity(0)),
    ),
)
DATA_ROOT = STUDY["data_root"]
# Datasets by the folder they are prepared into (a user's function: its token).
DATASETS_BY_FOLDER = {
    user_data.folder_name(c.spec["dataset"]): c.spec["dataset"] for c in CELLS.values()
}
# The user's own datasets the planned cells train on.
USER_DATASETS = {
    name: dataset
    for name, dataset in ALL_USER_DATASETS.items()
    if name in DATASETS_BY_FOLDER.values()
}
# The user's model factories: editing one flags the cells made with it as stale (collect).
USER_MODEL_FILES = sorted(
    {
        str(path)
        for c in CELLS.values()
        if (path := models.source_file(c.spec["model"], c.spec["code_path"]))
    }
)


# Also what keeps {wildcards.cell} and {wildcards.dataset} plain words in shell commands.
wildcard_constraints:
    cell="[a-z0-9_p-]+",
    dataset="[a-z0-9_]+",


def cell_of(wildcards):
    """The cell of a train job's wildcards (or the cell itself: like_floor_cell passes one)."""
    return wildcards if isinstance(wildcards, sweeps.Cell) else CELLS[wildcards.cell]


def cell_spec(wildcards):
    return cell_of(wildcards).params()


def dataset_meta(name):
    return f"{DATA_ROOT}/{user_data.folder_name(name)}/meta.json"


def cell_dataset(wildcards):
    """The cell's prepared data: ancient for the registry's (preparing again reruns no cell), as
    it is for a user's own (images added, the function edited: the cells rerun)."""
    name = cell_of(wildcards).spec["dataset"]
    return dataset_meta(name) if name in USER_DATASETS else ancient(dataset_meta(name))


def cell_ext(wildcards):
    return (
        [outputs.EXT_BUILD]
        if models.needs_ext(cell_of(wildcards).spec["model"])
        else []
    )


def cell_priority(wildcards):
    return PRIORITIES[wildcards.cell]


def cell_resources(wildcards):
    cell = cell_of(wildcards)
    return train_resources(cell.spec, cell.resources, GPU_JOBS)


def cell_resource(name):
    """The train rule's resource `name` of a cell (dpstudy.study.resources computes them all)."""
    return lambda wildcards: cell_resources(wildcards)[name]


def floor_cell():
    """The cell whose machine the floor takes: the first that trains on one device of one node
    (its threads, GPU and cluster resources); None where no cell trains (the floor measures then
    what a one-device cell of the first setting would get)."""
    trained = [cell for cell in CELLS.values() if trains(cell)]
    one_device = [c for c in trained if c.gpus == 1 and c.spec["nodes"] == 1]
    return (one_device or trained or list(CELLS.values()))[0]


def trains(cell):
    """Whether the cell's job starts torch (its launcher skips the others without)."""
    return not gap_before_start(cell.spec, cell_resources(cell)["node_gpus"])


def floor_round_records(wildcards):
    """The records of the cells of a repeat round that train: its floor runs after them."""
    repeat = int(wildcards.repeat)
    return [
        outputs.record_path(cell.id)
        for cell in CELLS.values()
        if cell.spec["repeat"] == repeat and trains(cell)
    ]


def like_floor_cell(function):
    """A train rule's function of wildcards, for the floor job: the floor cell's value."""
    return lambda wildcards: function(floor_cell())


def cell_threads(wildcards):
    # On CPU the cores are what a cell measures: a local run gives it the whole machine, so no
    # other job (another cell, the extension build) competes with it. GPU cells share the host.
    # A cell its launcher skips without starting torch measures nothing: one core.
    resources = cell_resources(wildcards)
    if gap_before_start(cell_of(wildcards).spec, resources["node_gpus"]):
        return 1
    cores = resources["node_cores"]
    return cores if GPU_JOBS else max(cores, workflow.cores)
