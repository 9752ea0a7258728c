# The study config -> the CELLS table, and the small helpers the rules use.
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

# This checkout's dpstudy, for the workflow itself and for every job (also in --sdm conda).
sys.path.insert(0, workflow.basedir)

from dpstudy import study as studies
from dpstudy.data import DATASETS
from dpstudy.gpus import visible_gpu_count
from dpstudy.models import MODELS
from dpstudy.provenance import export_checkout
from dpstudy.schema import ConfigError

export_checkout(workflow.basedir)

try:
    STUDY = studies.load(config)
    ALL_CELLS = studies.expand(STUDY)
except ConfigError as error:
    raise WorkflowError(f"invalid study config: {error}") from None

# On a host without GPUs, device 'auto' resolves to the CPU: its cells take no GPU resource.
CUDA_POSSIBLE = STUDY["device"] == "cuda" or (
    STUDY["device"] == "auto" and visible_gpu_count() > 0
)


def needs_gpu(cell):
    return CUDA_POSSIBLE


_kept, _left_out = studies.within_gpu_budget(
    ALL_CELLS, workflow.global_resources.get("gpu").value, needs_gpu
)
if _left_out:
    logger.warning(
        f"{len(_left_out)} cells need more GPUs than --resources gpu allows and are left out: "
        + ", ".join(c.id for c in _left_out)
    )
CELLS = {cell.id: cell for cell in _kept}
RECORDS = [f"results/cells/{cell}/record.json" for cell in CELLS]
DATA_ROOT = STUDY["data_root"]


wildcard_constraints:
    cell="[a-z0-9_p-]+",
    dataset="[a-z0-9_]+",


def cell_of(wildcards):
    return CELLS[wildcards.cell]


def cell_spec(wildcards):
    return cell_of(wildcards).params()


def cell_dataset(wildcards):
    return f"{DATA_ROOT}/{cell_of(wildcards).spec['dataset']}/meta.json"


def cell_ext(wildcards):
    return (
        ["results/ext/build.json"]
        if MODELS[cell_of(wildcards).spec["model"]].needs_ext
        else []
    )


def cell_gpus(wildcards):
    return cell_of(wildcards).gpus if needs_gpu(cell_of(wildcards)) else 0


def cell_cores(wildcards):
    # A device is one process on one core on CPU; DataLoader workers need cores of their own.
    spec = cell_of(wildcards).spec
    return spec["gpus"] * (1 + spec["workers"])


def cell_threads(wildcards):
    # On CPU the cores are what a cell measures: it takes the whole machine, so no other job
    # (another cell, the extension build) competes with it. GPU cells share the host.
    return (
        cell_cores(wildcards)
        if CUDA_POSSIBLE
        else max(cell_cores(wildcards), workflow.cores)
    )


def cell_launcher(wildcards):
    spec = cell_of(wildcards).spec
    if spec["mode"] == "ddp":
        return f"torchrun --standalone --nproc-per-node={spec['gpus']}"
    return "python"
