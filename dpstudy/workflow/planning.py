"""A study config -> the study as the workflow runs it (Study), before any job: the validated
config, the cells this run plans, the user's own datasets with the fingerprint of what preparing
each reads, the check of the user's models and data (dpstudy.workflow.usercheck), whether jobs
reserve GPUs, the extension build's arguments, the memory allocator, and every decision the rules
take from them (which cells fit the GPU budget, priorities, the floor's rounds, each job's
resources, threads and inputs). rules/common.smk calls `load_study` once and turns its ConfigError
into Snakemake's "invalid study config"; its input functions only delegate to the Study. The tests
call it in process where Snakemake itself is not under test.
No torch and no pandas: the workflow plans in Snakemake's own process."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from dpstudy import models
from dpstudy.data import user as user_data
from dpstudy.ext import arch as ext_arch
from dpstudy.jobs.gpus import visible_gpu_count
from dpstudy.study import forecast_requests, outputs, resources, sweeps
from dpstudy.study.spec import gap_before_start
from dpstudy.study.sweeps import Cell, JsonDict
from dpstudy.util import allocator
from dpstudy.workflow import estimates, submission, traces, usercheck, windows


@dataclass
class Study:
    """The study as the workflow runs it; the rules read every decision from here."""

    config: dict[str, Any]  # the validated study, every documented default filled in
    cells: list[Cell]  # the cells this run plans (those within --resources gpu), in sweep order
    left_out: list[Cell]  # ... and those that need more GPUs than --resources gpu allows
    user_datasets: dict[str, user_data.UserDataset]  # the study's own datasets, by name
    fingerprints: dict[str, str]  # ... and what preparing each reads (new images: prepared anew)
    gpu_jobs: bool  # whether jobs reserve GPUs (config request_gpus; device auto on a CPU host: no)
    ext_build_args: list[str]  # scripts/build_ext.py's: the planned CUDA architectures, --require-cuda
    allocator: allocator.Setup  # what config allocator means on the planning host
    gpu_budget: int | None = None  # --resources gpu=N: the GPUs jobs may reserve at once
    visible_gpus: int = 0  # the GPUs the planning host shows
    host_cores: int = 1  # the cores the planning process may run on

    # ---- the cells and their order ---------------------------------------------------------

    @cached_property
    def by_id(self) -> dict[str, Cell]:
        return {cell.id: cell for cell in self.cells}

    def cell(self, cell_id: str) -> Cell:
        return self.by_id[cell_id]

    @property
    def left_out_warning(self) -> str | None:
        """The one warning naming the cells left out for want of GPUs (dpstudy.gpucheck.study reads it)."""
        if not self.left_out:
            return None
        return f"{len(self.left_out)} cells need more GPUs than --resources gpu allows and are left out: " + ", ".join(
            cell.id for cell in self.left_out
        )

    @cached_property
    def priorities(self) -> dict[str, int]:
        """Each cell's Snakemake priority: the repeats interleaved (dpstudy.study.sweeps.run_priorities)."""
        return sweeps.run_priorities(self.cells)

    @property
    def before_cells(self) -> int:
        """The priority of the jobs that measure nothing and that cells or benchmarks wait for (the
        data, the resolved study and the memory plan it feeds, the extension's build): above every
        cell's, so that they run first, side by side on one core each. At priority 0 the build
        waited for the last skipped cell to free a core, and every timed cell then waited for its
        compile on an idle core."""
        return max(self.priorities.values(), default=0) + 1

    @property
    def records(self) -> list[str]:
        return [outputs.record_path(cell.id) for cell in self.cells]

    # ---- the machine's floor ---------------------------------------------------------------

    @cached_property
    def floor_rounds(self) -> dict[int, int]:
        """{repeat round: priority} of the floor runs (none with fewer than two rounds, or bench.floor off)."""
        return sweeps.floor_rounds(self.cells, self.priorities) if self.config["bench"]["floor"] else {}

    @property
    def floor_files(self) -> list[str]:
        return [outputs.floor_path(repeat) for repeat in self.floor_rounds]

    @cached_property
    def floor_cell(self) -> Cell:
        """The cell whose machine the floor takes: the first that trains on one device of one node
        (its threads, GPU and cluster resources); the first cell where none trains (the floor then
        measures what a one-device cell of the first setting would get)."""
        trained = [cell for cell in self.cells if self.trains(cell.id)]
        one_device = [c for c in trained if c.gpus == 1 and c.spec["nodes"] == 1]
        return (one_device or trained or self.cells)[0]

    def floor_round_records(self, repeat: int) -> list[str]:
        """The records of the cells of a repeat round that train: its floor runs after them."""
        return [
            outputs.record_path(cell.id)
            for cell in self.cells
            if cell.spec["repeat"] == repeat and self.trains(cell.id)
        ]

    # ---- a cell's job ------------------------------------------------------------------------

    def cell_resources(self, cell_id: str, packing: bool = False) -> dict[str, Any]:
        """The train job's resources (dpstudy.study.resources.train_resources); in a run that packs
        (`packing`), a packed cell's also take its pack slot and a minute for its launch and stop.
        Made once per cell (Snakemake asks for each resource apart, and again for every group
        job it prints): the dict is shared, not to be changed."""
        if (cell_id, packing) not in self._resources:
            self._resources[cell_id, packing] = self._cell_resources(cell_id, packing)
        return self._resources[cell_id, packing]

    @cached_property
    def _resources(self) -> dict[tuple[str, bool], dict[str, Any]]:
        return {}

    def _cell_resources(self, cell_id: str, packing: bool) -> dict[str, Any]:
        cell = self.cell(cell_id)
        out = resources.train_resources(cell.spec, cell.resources, self.gpu_jobs)
        packed = packing and self.submission.groups[cell_id] is not None
        out[submission.PACK_SLOT] = 1 if packed else None
        if packed:
            out["runtime"] += submission.PACK_MARGIN_MIN
        return out

    @cached_property
    def estimates(self) -> dict[str, estimates.Estimate]:
        """Each cell's estimated wall time (dpstudy.workflow.estimates)."""
        return estimates.estimates(self.cells, self.config["cluster"]["cell_minutes"], self.trains)

    @cached_property
    def submission(self) -> submission.Submission:
        """How a run that packs submits the cells (dpstudy.workflow.submission), within the site's limits."""
        return submission.plan(self.cells, self.config["cluster"], self.estimates, submission.site_limit())

    def trains(self, cell_id: str) -> bool:
        """Whether the cell's job starts torch (its launcher skips the others without)."""
        return not gap_before_start(self.cell(cell_id).spec, self.cell_resources(cell_id)["node_gpus"])

    def cell_threads(self, cell_id: str, cores: int) -> int:
        """The train job's threads, `cores` being the workflow's. On CPU the cores are what a cell
        measures: a local run gives it the whole machine, so that no other job (another cell, the
        extension's build) competes with it. GPU cells share the host. A cell its launcher skips
        without starting torch measures nothing: one core."""
        if not self.trains(cell_id):
            return 1
        node_cores = self.cell_resources(cell_id)["node_cores"]
        return node_cores if self.gpu_jobs else max(node_cores, cores)

    def cell_ext(self, cell_id: str) -> list[str]:
        """The extension's build, where the cell's model runs it."""
        return [outputs.EXT_BUILD] if models.needs_ext(self.cell(cell_id).spec["model"]) else []

    @property
    def cell_plan_files(self) -> list[str]:
        """The memory plan, for a study under memory_budget_gib, whose verdicts its cells need."""
        return [outputs.MEMORY_PLAN] if self.config["memory_budget_gib"] else []

    # ---- datasets and the user's code --------------------------------------------------------

    @cached_property
    def datasets_by_folder(self) -> dict[str, str]:
        """The planned cells' datasets by the folder they are prepared into (a function's: its token)."""
        return {user_data.folder_name(c.spec["dataset"]): c.spec["dataset"] for c in self.cells}

    def dataset_in(self, folder: str) -> str:
        return self.datasets_by_folder.get(folder, folder)

    def dataset_overrides(self, folder: str) -> JsonDict:
        """The study's settings of the dataset prepared into `folder` (config `datasets`)."""
        return JsonDict(self.config["datasets"].get(self.dataset_in(folder), {}))

    def data_fingerprint(self, folder: str) -> str:
        """What preparing a user's dataset reads ("" for the registry's): a change prepares it anew."""
        return self.fingerprints.get(self.dataset_in(folder), "")

    @cached_property
    def planned_user_datasets(self) -> dict[str, user_data.UserDataset]:
        """The user's own datasets the planned cells train on."""
        planned = set(self.datasets_by_folder.values())
        return {name: dataset for name, dataset in self.user_datasets.items() if name in planned}

    def data_folder(self, folder: str) -> str:
        """Where a dataset is prepared: `folder` (its name, or a function's token) under the data root."""
        return f"{self.config['data_root']}/{folder}"

    def data_meta(self, dataset: str) -> str:
        """The prepared dataset's ready marker."""
        return f"{self.data_folder(user_data.folder_name(dataset))}/meta.json"

    @property
    def user_data_files(self) -> list[str]:
        """The ready markers of the user's own datasets the planned cells train on."""
        return [self.data_meta(name) for name in self.planned_user_datasets]

    def cell_data(self, cell_id: str) -> str:
        return self.data_meta(self.cell(cell_id).spec["dataset"])

    def data_reruns_cell(self, cell_id: str) -> bool:
        """Whether the cell's data prepared anew reruns it: a user's own (images added, the function
        edited) does; the registry's does not (the train rule takes it as ancient)."""
        return self.cell(cell_id).spec["dataset"] in self.planned_user_datasets

    @cached_property
    def user_model_files(self) -> list[str]:
        """The user's model factories: editing one flags the cells made with it as stale (collect)."""
        files = {models.source_file(c.spec["model"], c.spec["code_path"]) for c in self.cells}
        return sorted(str(path) for path in files if path)

    # ---- the benchmarks, the memory plan and the tables --------------------------------------

    @cached_property
    def comm_world_sizes(self) -> list[int]:
        """The collectives' world sizes: what the cells run and forecast: asks for, as far as this host holds."""
        capacity = resources.rank_capacity(self.gpu_jobs, self.visible_gpus, self.gpu_budget, self.host_cores)
        wanted = [request["gpus"] for request in forecast_requests.requests(self.config)]
        return resources.comm_world_sizes([c.spec for c in self.cells], wanted, capacity)

    @property
    def comm_bench_gpus(self) -> int:
        return resources.comm_bench_gpus(self.gpu_jobs, self.visible_gpus, max(self.comm_world_sizes))

    @property
    def kernel_bench_gpus(self) -> int:
        return 1 if self.gpu_jobs else 0

    @property
    def memory_plan_gpus(self) -> int:
        return resources.plan_gpus(self.gpu_jobs, self.visible_gpus, self.gpu_budget)

    def budget_args(self, flag: str) -> list[str]:
        """[`flag`, the study's memory_budget_gib], or none without a budget."""
        budget = self.config["memory_budget_gib"]
        return [flag, str(budget)] if budget else []

    @property
    def bench_files(self) -> list[str]:
        """The microbenchmarks the study asks for (config `bench`), shown in the report."""
        return [outputs.bench_csv(name) for name in outputs.BENCHMARKS if self.config["bench"][name]]

    @property
    def comm_files(self) -> list[str]:
        """comm_bench's table, whose fits price the step model's collectives, where the study measures it."""
        return [path for path in self.bench_files if path == outputs.bench_csv("comm")]

    @property
    def forecast_requests(self) -> str:
        """The study's forecast: block, as the forecasts collect makes (JSON)."""
        return json.dumps(forecast_requests.requests(self.config), sort_keys=True)


def load_study(
    config: dict[str, Any],
    config_files: Iterable[str] = (),
    gpu_budget: int | None = None,
    user_check: str | None = outputs.USER_CHECK,
    visible_gpus: int | None = None,
    capabilities: Iterable[tuple[int, int]] | None = None,
    host_cores: int | None = None,
) -> Study:
    """The Study of `config`, or ConfigError naming the key, value or sweep at fault. `gpu_budget`:
    --resources gpu (None: not given); `user_check`: where the verdict of the user-code check is
    remembered (None: no check); `visible_gpus`, `capabilities` and `host_cores`: this host's,
    asked of NVML and the OS unless given."""
    config = sweeps.load(config, config_files)
    memory_allocator = allocator.resolve(config["allocator"])  # a library this host lacks: an error now
    cells = sweeps.expand(config)
    datasets = user_data.in_study(config, cells)
    fingerprints = {name: user_data.fingerprint(dataset) for name, dataset in datasets.items()}
    windows.check(config, cells)  # text cells: seq_len against the model and the corpus
    traces.check(cells)  # traced cells: a profiler that gives what the traces are reduced from
    if user_check is not None:
        usercheck.check(config, cells, user_check, fingerprints)
    visible_gpus = visible_gpu_count() if visible_gpus is None else visible_gpus
    gpu_jobs = resources.requests_gpus(config, visible_gpus)
    visible = ext_arch.visible_capabilities() if capabilities is None else capabilities
    kept, left_out = sweeps.within_gpu_budget(cells, gpu_budget, gpu_jobs)
    return Study(
        config,
        kept,
        left_out,
        datasets,
        fingerprints,
        gpu_jobs,
        ext_arch.build_args(config["ext"]["cuda_arch"], gpu_jobs, visible),
        memory_allocator,
        gpu_budget,
        visible_gpus,
        len(os.sched_getaffinity(0)) if host_cores is None else host_cores,
    )
