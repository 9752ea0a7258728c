# The study, loaded once (dpstudy.workflow.planning.Study holds every decision the rules take
# from it), and the input functions the rules call, each delegating to it.
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

# This checkout's dpstudy, for the workflow itself and for every job (also in --sdm conda).
sys.path.insert(0, workflow.basedir)

from dpstudy.study import outputs, sweeps
from dpstudy.record.envinfo import torch_version
from dpstudy.record.provenance import code_files, native_files
from dpstudy.util.errors import ConfigError
from dpstudy.jobs import plan_file
from dpstudy.workflow import estimates, process, submission
from dpstudy.workflow.planning import load_study

process.prepare(workflow.basedir)

try:
    # --resources gpu=N: the GPUs jobs may reserve at once (None where not given)
    STUDY = load_study(
        config,
        workflow.configfiles,
        gpu_budget=workflow.global_resources.get("gpu").value,
    )
except ConfigError as error:
    raise WorkflowError(f"invalid study config: {error}") from None
if STUDY.left_out_warning:
    logger.warning(STUDY.left_out_warning)


# Also what keeps {wildcards.cell} and {wildcards.dataset} plain words in shell commands.
wildcard_constraints:
    cell="[a-z0-9_p-]+",
    dataset="[a-z0-9_]+",


def cell_spec(wildcards):
    return STUDY.cell(wildcards.cell).params()


def cell_dataset(wildcards):
    """The cell's prepared data, ancient where preparing it again reruns no cell (Study.data_reruns_cell)."""
    path = STUDY.cell_data(wildcards.cell)
    return path if STUDY.data_reruns_cell(wildcards.cell) else ancient(path)


def cell_ext(wildcards):
    return [ancient(path) for path in STUDY.cell_ext(wildcards.cell)]


def cell_memory_plan(wildcards):
    return [ancient(path) for path in STUDY.cell_plan_files]


def cell_priority(wildcards):
    return STUDY.priorities[wildcards.cell]


def cell_threads(wildcards):
    return STUDY.cell_threads(wildcards.cell, workflow.cores)


def cell_resource(name):
    """The train rule's resource `name` of a cell (dpstudy.study.resources computes them all)."""
    return lambda wildcards: STUDY.cell_resources(wildcards.cell, packing_on())[name]


_PACKING = (
    []
)  # decided once, when the jobs are made: the run's settings are not known before


def packing_on():
    """Whether this run packs train cells into jobs (dpstudy.workflow.submission): the planning
    process of a run whose profile asks for it (profiles/slurm), never a job's own Snakemake.
    """
    if not _PACKING:
        asked = (
            workflow.group_settings.group_components.get(submission.PACK_GROUP, 1) > 1
        )
        on = asked and not workflow.remote_exec
        if on:
            local = {
                name
                for name in workflow.global_resources
                if workflow.resource_scopes.is_local(name)
            }
            missing = submission.missing_profile_settings(
                workflow.group_settings.group_components,
                workflow.global_resources,
                local,
            )
            if missing:
                raise WorkflowError(
                    "packing train cells into jobs (--group-components "
                    f"{submission.PACK_GROUP}=N) also needs these settings: {'; '.join(missing)}"
                    " (profiles/slurm has them; a --resources on the command line replaces its list)"
                )
            if any(STUDY.submission.groups.values()):
                # A retried pack would rerun its finished cells: a packed cell keeps its own time
                # limit instead (dpstudy.jobs.launch), which is what the retry was for.
                workflow.get_rule("train").restart_times = 0
            logger.info(f"dpstudy: {STUDY.submission.summary()}")
        _PACKING.append(on)
    return _PACKING[0]


def cell_group(wildcards):
    """The cell's pack, in a run that packs (None: a job of its own)."""
    if not packing_on():
        return None
    pack = STUDY.submission.groups[wildcards.cell]
    if (
        pack is not None
    ):  # as Snakemake does for a group named with wildcards: one parent id for all
        workflow.parent_groupids[pack] = submission.PACK_GROUP
    return pack


onstart:
    process.tell_keep_going(workflow.execution_settings.keep_going)
    # each cell's estimate and pack, where its job reads them (its record keeps them)
    plan_file.write(
        estimates.plan_entries(
            STUDY.estimates, STUDY.submission.groups if packing_on() else None
        )
    )


def floor_threads(wildcards):
    return STUDY.cell_threads(STUDY.floor_cell.id, workflow.cores)


def floor_resource(name):
    """The floor job's resource `name`: the floor cell's (Study.floor_cell)."""
    return lambda wildcards: STUDY.cell_resources(STUDY.floor_cell.id)[name]


def floor_priority(wildcards):
    return STUDY.floor_rounds[int(wildcards.repeat)]


def floor_round_records(wildcards):
    return STUDY.floor_round_records(int(wildcards.repeat))


def dataset_name(wildcards):
    return STUDY.dataset_in(wildcards.dataset)


def dataset_overrides(wildcards):
    return STUDY.dataset_overrides(wildcards.dataset)


def dataset_fingerprint(wildcards):
    return STUDY.data_fingerprint(wildcards.dataset)


def bench_folder(wildcards, input):
    """The microbenchmarks' folder, where their files are (none run: the report finds none there)."""
    return Path(input.bench[0]).parent if input.bench else outputs.BENCH_DIR
