"""The study as the workflow runs it (dpstudy.workflow.planning.Study): every decision the rules
read from it, for a planning host given in the test (its GPUs, its cores, --resources gpu), so
that rules/common.smk only loads it and delegates."""

from __future__ import annotations

import copy

import pytest

from dpstudy.gpucheck.study import left_out_cells
from dpstudy.util import refs
from dpstudy.workflow.planning import load_study

SMALL = {
    "study": "workflow_test",
    "datasets": {"synthetic": {"train_size": 512, "test_size": 128}},
    "defaults": {"epochs": 1, "repeats": 2},
    "bench": {"kernels": False, "comm": True},
    "sweeps": [
        {
            "name": "alpha",
            "dataset": "synthetic",
            "model": "lenet",
            "grid": {"mode": ["single", "ddp"], "gpus": [1, 2], "batch": [64], "backend": ["gloo"]},
        },
        # DP needs CUDA: on a host whose jobs reserve no GPU its launcher skips it before torch
        {
            "name": "beta",
            "dataset": "synthetic",
            "model": "lenet_ext",
            "grid": {"mode": ["dp"], "gpus": [2], "batch": [32]},
        },
    ],
    "forecast": [{"mode": ["ddp"], "gpus": [4, 8], "batch": [64], "backend": ["nccl"]}],
}
SINGLE, DDP1, DDP2, DP2 = (
    "synthetic-lenet-single-g1-b64-none",
    "synthetic-lenet-ddp-g1-b64-gloo",
    "synthetic-lenet-ddp-g2-b64-gloo",
    "synthetic-lenet_ext-dp-g2-b32-none",
)


def study(config=SMALL, gpu_budget=None, visible_gpus=0, host_cores=2, **changes):
    return load_study(
        {**copy.deepcopy(config), **changes},
        gpu_budget=gpu_budget,
        user_check=None,
        visible_gpus=visible_gpus,
        capabilities=[],
        host_cores=host_cores,
    )


def test_cells_beyond_the_gpu_budget_are_left_out_with_one_warning_naming_them():
    planned = study(device="cuda", gpu_budget=1)
    assert [c.id for c in planned.cells] == [f"{SINGLE}-r0", f"{SINGLE}-r1", f"{DDP1}-r0", f"{DDP1}-r1"]
    left_out = [f"{DDP2}-r0", f"{DDP2}-r1", f"{DP2}-r0", f"{DP2}-r1"]
    assert [c.id for c in planned.left_out] == left_out
    assert planned.left_out_warning == (
        "4 cells need more GPUs than --resources gpu allows and are left out: " + ", ".join(left_out)
    )
    assert left_out_cells([f"WARNING {planned.left_out_warning}"]) == left_out  # as the GPU check reads it
    assert planned.records == [f"results/cells/{c.id}/record.json" for c in planned.cells]
    # no budget, or jobs that reserve no GPU (a CPU study): every cell stays, no warning
    for everything in (study(device="cuda"), study(device="cpu", gpu_budget=1)):
        assert len(everything.cells) == 8 and everything.left_out == [] and everything.left_out_warning is None


def test_priorities_interleave_the_repeats_and_the_jobs_cells_wait_for_come_first():
    planned = study()
    assert planned.priorities == {
        f"{SINGLE}-r0": 8,
        f"{DDP1}-r0": 7,
        f"{DDP2}-r0": 6,
        f"{DP2}-r0": 5,
        f"{SINGLE}-r1": 4,
        f"{DDP1}-r1": 3,
        f"{DDP2}-r1": 2,
        f"{DP2}-r1": 1,
    }
    assert planned.before_cells == 9


def test_the_floor_runs_once_per_round_after_its_cells_that_train():
    planned = study()
    # each at its round's lowest priority: after round 0 (5 and up), before round 1 (4 and down)
    assert planned.floor_rounds == {0: 5, 1: 1}
    assert planned.floor_files == ["results/floor/r0.json", "results/floor/r1.json"]
    # the DP cell is skipped before torch starts on this CPU host: no floor waits for it
    assert planned.floor_round_records(1) == [f"results/cells/{c}-r1/record.json" for c in (SINGLE, DDP1, DDP2)]
    assert planned.floor_cell.id == f"{SINGLE}-r0"  # one device, one node, trains
    assert study(bench={"floor": False, "comm": True, "kernels": False}).floor_rounds == {}
    assert study(defaults={"epochs": 1, "repeats": 1}).floor_files == []  # one round: no CV


def test_a_cpu_cell_takes_the_machine_a_skipped_one_one_core_a_gpu_cell_its_own_cores():
    cpu = study()
    assert not cpu.gpu_jobs
    assert [cpu.trains(f"{c}-r0") for c in (SINGLE, DDP2, DP2)] == [True, True, False]
    assert cpu.cell_threads(f"{SINGLE}-r0", 8) == 8  # the workflow's cores
    assert cpu.cell_threads(f"{DDP2}-r0", 1) == 2  # at least one per process
    assert cpu.cell_threads(f"{DP2}-r0", 8) == 1
    gpu = study(device="cuda", visible_gpus=8)
    assert gpu.gpu_jobs and gpu.trains(f"{DP2}-r0")
    assert gpu.cell_threads(f"{SINGLE}-r0", 8) == 1 and gpu.cell_threads(f"{DP2}-r0", 8) == 2
    assert gpu.cell_resources(f"{DDP2}-r0")["gpu"] == 2 and cpu.cell_resources(f"{DDP2}-r0")["gpu"] == 0
    assert cpu.cell_ext(f"{DP2}-r0") == ["results/ext/build.json"] and cpu.cell_ext(f"{SINGLE}-r0") == []


def test_the_collectives_are_measured_at_each_world_size_this_host_holds():
    # the cells' 2 and forecast's 4 and 8, as far as the host holds ranks
    assert study(host_cores=2).comm_world_sizes == [2]  # a CPU study: its cores
    assert study(host_cores=8).comm_world_sizes == [2, 4, 8]
    gpus = study(device="cuda", visible_gpus=8, gpu_budget=4)
    assert gpus.comm_world_sizes == [2, 4] and gpus.comm_bench_gpus == 4
    assert gpus.memory_plan_gpus == 1 and gpus.kernel_bench_gpus == 1
    login_node = study(device="cuda", visible_gpus=0)  # knows neither: every size, all the GPUs asked
    assert login_node.comm_world_sizes == [2, 4, 8] and login_node.comm_bench_gpus == 8
    assert login_node.memory_plan_gpus == 0  # no GPU here to measure the workspaces on
    cpu = study()
    assert (cpu.comm_bench_gpus, cpu.memory_plan_gpus, cpu.kernel_bench_gpus) == (0, 0, 0)


def test_the_benchmarks_forecasts_and_budget_the_study_asks_for():
    planned = study()
    assert planned.bench_files == planned.comm_files == ["results/bench/comm.csv"]
    assert study(bench={"kernels": True, "comm": False}).comm_files == []
    assert planned.forecast_requests.startswith('[{"backend": "nccl", "batch": 64, "dataset": null, "gpus": 4,')
    assert planned.budget_args("--budget-gib") == [] and planned.cell_plan_files == []
    budgeted = study(memory_budget_gib=0.5)
    assert budgeted.budget_args("--budget-gib") == ["--budget-gib", "0.5"]
    assert budgeted.cell_plan_files == ["results/plan/memory.csv"]


@pytest.fixture
def own_code(tmp_path, monkeypatch):
    """A code_path with a model factory and a dataset function."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "nets.py").write_text("def tiny(in_channels, image_size, num_classes):\n    pass\n")
    (tmp_path / "my_data.py").write_text("def make(root):\n    pass\n")
    return tmp_path


def test_the_users_datasets_and_factories_by_the_folder_they_are_prepared_into(own_code):
    config = {
        "study": "own",
        "code_path": str(own_code),
        "data_root": "data",
        "datasets": {"synthetic": {"train_size": 64, "test_size": 32}},
        "sweeps": [
            {"name": "made", "dataset": "my_data:make", "model": "nets:tiny", "grid": {"mode": ["single"]}},
            {"name": "plain", "dataset": "synthetic", "model": "lenet", "grid": {"mode": ["single"]}},
        ],
    }
    planned = study(config)
    folder = refs.token("my_data:make")
    made, plain = (c.id for c in planned.cells)
    assert planned.datasets_by_folder == {folder: "my_data:make", "synthetic": "synthetic"}
    assert planned.dataset_in(folder) == "my_data:make" and planned.dataset_in("other") == "other"
    assert list(planned.planned_user_datasets) == ["my_data:make"]
    assert planned.user_data_files == [f"data/{folder}/meta.json"]  # what the memory plan reads
    assert planned.cell_data(made) == f"data/{folder}/meta.json"
    assert planned.cell_data(plain) == "data/synthetic/meta.json"
    # a user's own data prepared anew reruns its cells; the registry's does not
    assert planned.data_reruns_cell(made) and not planned.data_reruns_cell(plain)
    assert len(planned.data_fingerprint(folder)) == 16 and planned.data_fingerprint("synthetic") == ""
    assert str(planned.dataset_overrides("synthetic")) == '{"test_size": 32, "train_size": 64}'
    assert str(planned.dataset_overrides(folder)) == "{}"
    assert planned.user_model_files == [str(own_code / "nets.py")]
