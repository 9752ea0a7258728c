"""The memory plan (dpstudy.workflow.memory_plan): fake-tensor predictions per mode, the plan's rows and
the budget check. The prediction against a real tracked step is tests/unit/engine/test_train.py's
test_memory_split_is_recorded_and_predicted_before_training."""

import pytest

from dpstudy.data.task import Task
from dpstudy.jobs import launch
from dpstudy.study.spec import complete
from dpstudy.workflow import memory_plan

LENET = complete({"dataset": "synthetic", "model": "lenet", "mode": "single", "batch": 64})
PARAMS_MB = 0.404945  # LeNet's 106,154 fp32 parameters (dpstudy.models.cost)


def test_ddp_predicts_one_device_at_its_share_of_the_batch_and_a_copy_of_the_gradients():
    single = memory_plan.predict(LENET)
    ddp = memory_plan.predict({**LENET, "mode": "ddp", "gpus": 2, "backend": "gloo"})
    half = memory_plan.predict({**LENET, "batch": 32})
    assert single["params_mb"] == [pytest.approx(PARAMS_MB, rel=1e-5)]
    # both ranks hold what one device holds at batch 32, and DDP's copy of the gradients
    assert ddp["peak_mb"] == [pytest.approx(half["peak_mb"][0] + PARAMS_MB, rel=1e-5)] * 2
    assert ddp["activations_mb"][0] == pytest.approx(half["activations_mb"][0] + PARAMS_MB, rel=1e-5)


def test_fsdp_shards_parameters_gradients_and_optimizer_state_over_the_fake_world():
    fsdp = memory_plan.predict({**LENET, "mode": "fsdp", "gpus": 2, "backend": "gloo", "optimizer": "adam"})
    assert len(fsdp["peak_mb"]) == 2
    # Adam's two moments of this rank's half of the parameters
    assert fsdp["optimizer_mb"][0] == pytest.approx(PARAMS_MB, rel=0.02)
    assert fsdp["peak_mb"][0] == pytest.approx(sum(fsdp[f"{p}_mb"][0] for p in memory_plan.PARTS))


def test_dp_puts_the_optimizer_and_the_whole_batch_on_device_0():
    dp = memory_plan.predict({**LENET, "mode": "dp", "gpus": 2})
    assert dp["optimizer_mb"][1] == 0 < dp["optimizer_mb"][0]
    batch_rest_mb = 32 * 28 * 28 * 4 / 2**20  # the half of the batch device 1 gets, first on device 0
    assert dp["activations_mb"][0] - dp["activations_mb"][1] == pytest.approx(batch_rest_mb)
    assert dp["peak_mb"][0] > dp["peak_mb"][1]


def test_the_allocator_prediction_adds_the_resident_data_and_ddps_buckets():
    sizes = (1000, 200)  # samples of 1x28x28 uint8 and an int64 label each
    data_mb = 1200 * (28 * 28 + 8) / 2**20
    single = memory_plan.predict(LENET, sizes=sizes)
    assert single["allocated_mb"] == [pytest.approx(single["peak_mb"][0] + data_mb + 1000 * 8 / 2**20)]
    ddp = memory_plan.predict({**LENET, "mode": "ddp", "gpus": 2, "backend": "gloo"}, sizes=sizes)
    # each rank: both splits, its half of the epoch's indices, and the buckets (a copy of the gradients)
    assert ddp["allocated_mb"] == [pytest.approx(ddp["peak_mb"][0] + data_mb + 500 * 8 / 2**20 + PARAMS_MB)] * 2
    dp = memory_plan.predict({**LENET, "mode": "dp", "gpus": 2}, sizes=sizes)  # one loader, on device 0
    assert dp["allocated_mb"][1] == pytest.approx(dp["peak_mb"][1])
    assert dp["allocated_mb"][0] == pytest.approx(dp["peak_mb"][0] + data_mb + 1000 * 8 / 2**20)
    torch_loader = memory_plan.predict({**LENET, "loader": "torch"}, sizes=sizes)
    assert torch_loader["allocated_mb"] == [pytest.approx(torch_loader["peak_mb"][0])]
    assert memory_plan.predict(LENET)["allocated_mb"] == [None]  # a download not yet prepared: unknown


def test_split_sizes_of_generated_prepared_and_unprepared_datasets(tmp_path):
    from dpstudy.data import store

    assert store.split_sizes("synthetic", tmp_path) == (10000, 2000)  # the generator's defaults
    assert store.split_sizes("synthetic", tmp_path, {"train_size": 64}) == (64, 2000)
    assert store.split_sizes("mnist", tmp_path) is None  # a download, not prepared
    store.prepare("synthetic", tmp_path, {"train_size": 48, "test_size": 16})
    assert store.split_sizes("synthetic", tmp_path, {"train_size": 999}) == (48, 16)  # what was prepared


ERROR = "The tensor has a non-zero number of elements, but its data is not allocated yet."


def test_the_plan_predicts_each_setting_once_and_says_why_a_cell_was_not(tmp_path, monkeypatch):
    predict = memory_plan.predict

    def custom_kernel(spec, steps=None, sizes=None):  # as a model whose kernel has no fake implementation fails
        if spec["model"] == "vgg19":
            raise RuntimeError(ERROR)
        return predict(spec, steps, sizes)

    monkeypatch.setattr(memory_plan, "predict", custom_kernel)
    cells = {
        "a-r0": {**LENET, "repeat": 0},
        "a-r1": {**LENET, "repeat": 1, "seed": 7},
        "bad": {**LENET, "model": "vgg19"},
    }
    lines = []
    rows = memory_plan.plan_rows(cells, log=lines.append)
    assert len(lines) == 2  # a-r1 is a-r0 but for its repeat and seed
    assert lines[1] == "[dpstudy] memory plan: bad: not predicted: RuntimeError: " + ERROR
    assert [r["cell"] for r in rows] == ["a-r0", "a-r1", "bad"]
    assert rows[0]["peak_mb"] == rows[1]["peak_mb"] > 0
    assert rows[2]["device"] is None and rows[2]["reason"].startswith("not predicted: ")
    assert all(r["skip"] is None for r in rows)  # no budget: every cell launches
    budgeted = memory_plan.plan_rows(cells, budget_gib=0.004, log=lines.append)  # 4.1 MB
    skip = budgeted[0]["skip"]
    assert rows[0]["peak_mb"] > 4.1 and skip == budgeted[1]["skip"]
    # device auto may run on CUDA: the need is the peak, 10 % for the allocator's fragmentation and
    # 1 GiB for the CUDA context and workspaces (the dataset's size is not given: the tracker's peak)
    gib = rows[0]["peak_mb"] / 1024
    assert skip == (
        f"predicted {gib * 1.1 + 1:.2f} GiB (allocator peak {gib:.2f} GiB + 10% + 1.00 GiB CUDA context and "
        "workspaces) > 0.004 GiB per device (study memory_budget_gib, memory plan)"
    )
    assert budgeted[2]["skip"] is None  # not predicted: launched
    assert memory_plan.plan_rows(cells, budget_gib=1.0, log=lines.append)[0]["skip"] == skip.replace("0.004", "1")
    assert memory_plan.plan_rows(cells, budget_gib=1.01, log=lines.append)[0]["skip"] is None
    on_cpu = {cell: {**spec, "device": "cpu"} for cell, spec in cells.items()}  # no CUDA context to hold
    assert memory_plan.plan_rows(on_cpu, budget_gib=1.1 * gib, log=lines.append)[0]["skip"] is None
    assert memory_plan.plan_rows(on_cpu, budget_gib=1.09 * gib, log=lines.append)[0]["skip"].startswith(
        f"predicted {gib * 1.1:.2f} GiB (allocator peak {gib:.2f} GiB + 10%) > "
    )
    path = tmp_path / "plan" / "memory.csv"
    memory_plan.write_plan(budgeted, str(path))
    assert launch.skip_reason(str(path), "a-r1") == skip
    assert launch.skip_reason(str(path), "bad") is None
    assert launch.skip_reason(str(path), "not-in-the-plan") is None


def test_a_model_whose_initialiser_reads_values_is_predicted():
    """ViT's trunc_normal_ samples by rejection (it reads values back), which fake tensors cannot;
    the plan builds the model on the meta device, where initialisers do nothing."""
    from dpstudy import models

    vit = complete({"dataset": "synthetic_rgb", "model": "vit", "mode": "single", "batch": 8})
    predicted = memory_plan.predict(vit)
    params_mb = models.cost("vit", Task.image(3, 32, 10))["params"] * 4 / 2**20
    assert predicted["params_mb"] == [pytest.approx(params_mb, rel=1e-6)]
    assert predicted["activations_mb"][0] > 0


def test_one_fake_step_serves_every_cell_that_runs_it(monkeypatch):
    step = memory_plan.tracked_fake_step
    ran = []

    def counted(spec, *args):
        ran.append((spec["mode"], spec["batch"]))
        return step(spec, *args)

    monkeypatch.setattr(memory_plan, "tracked_fake_step", counted)
    cells = {
        "single-b32": {**LENET, "batch": 32},
        "ddp-gloo": {**LENET, "mode": "ddp", "gpus": 2, "backend": "gloo"},  # 32 per device
        "ddp-nccl": {**LENET, "mode": "ddp", "gpus": 2, "backend": "nccl"},
        "dp": {**LENET, "mode": "dp", "gpus": 2},
        "fsdp": {**LENET, "mode": "fsdp", "gpus": 2, "backend": "gloo"},
        "fsdp-grad_op": {**LENET, "mode": "fsdp", "gpus": 2, "backend": "gloo", "shard": "grad_op"},
    }
    rows = {r["cell"]: r for r in memory_plan.plan_rows(cells, log=lambda _: None) if r["device"] == 0}
    assert ran == [("single", 32), ("fsdp", 64), ("fsdp", 64)]  # the plain model once, each sharding once
    # shared, the predictions are what each cell predicts alone
    for cell, spec in cells.items():
        assert rows[cell]["peak_mb"] == pytest.approx(max(memory_plan.predict(spec)["peak_mb"]))
    assert rows["ddp-gloo"]["peak_mb"] == rows["ddp-nccl"]["peak_mb"] > rows["single-b32"]["peak_mb"]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_language_model_s_step_is_predicted_as_the_tracker_measures_it(tmp_path, precision):
    """gpt tiny on generated text, one device: the plan's fake step against the tracker on a real
    step, at fp32 and under bf16 autocast (parameters fp32, activations bf16): within 15 %."""
    import functools

    import torch

    from dpstudy.data import store
    from dpstudy.engine import memory
    from dpstudy.engine.modes import MODES
    from dpstudy.engine.train import Trainer
    from dpstudy.models import build

    root = tmp_path / "data"
    spec = complete(
        {"dataset": "synthetic_text", "model": "gpt", "mode": "single", "batch": 8, "seq_len": 64}
        | {"precision": precision, "data_root": str(root), "optimizer": "adam"}
    )
    predicted = memory_plan.predict(spec)
    task = store.data_task("synthetic_text", root, 64)
    torch.manual_seed(0)
    trainer = Trainer(spec, MODES["single"](torch.device("cpu")), None, None, build("gpt", task), log=print)
    x, y = task.example_batch(8)
    trainer.step(x, y)  # the optimizer's state exists, as after training
    (parts,) = memory.tracked_step(trainer.model, trainer.optimizer, functools.partial(trainer.step, x, y)).values()
    for part in ("params", "optimizer", "activations", "peak"):
        assert predicted[f"{part}_mb"][0] == pytest.approx(parts[part], rel=0.15), (part, predicted, parts)
    assert predicted["params_mb"][0] == pytest.approx(124_672 * 4 / 2**20, rel=0.02)  # fp32 parameters either way
