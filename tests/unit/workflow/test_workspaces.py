"""cuDNN's workspaces in the memory plan (dpstudy.workflow.workspaces): the convolutions a fake step
runs, with the tracker's peaks around them, and how far their workspaces lift the step's peak.
On a GPU, the lift the plan predicts against what cuDNN adds to a real step."""

import pytest
import torch
from torch import nn

from dpstudy.data.task import Task
from dpstudy.study.spec import complete
from dpstudy.workflow import fake_step, memory_plan, workspaces

CUDA = torch.cuda.is_available()


def simplecnn(batch: int, device: str = "auto") -> dict:
    return complete(
        {"dataset": "synthetic_rgb", "model": "simplecnn", "mode": "single", "batch": batch, "device": device}
    )


def test_the_fake_step_names_every_convolution_at_its_shape_with_the_peaks_around_it():
    parts, _, convs = fake_step.tracked_fake_step(simplecnn(16), Task.image(3, 32, 10), 16)
    assert [c.input_shape for c in convs] == [(16, 3, 32, 32), (16, 32, 16, 16), (16, 64, 8, 8)]
    assert [c.config[:2] for c in convs] == [(3, 32), (32, 64), (64, 128)]
    assert [c.input_grad for c in convs] == [False, True, True]  # the data needs no gradient
    assert all(c.kind is nn.Conv2d and not c.channels_last for c in convs)
    for conv in convs:
        assert 0 < conv.peak_fw_mb <= parts["peak"] + 1e-6
        assert 0 < conv.peak_bw_mb <= parts["peak"] + 1e-6
    # forward keeps each layer's activations: the later a convolution runs, the more is held
    assert convs[0].peak_fw_mb < convs[1].peak_fw_mb < convs[2].peak_fw_mb


def conv_at(out: int, fw: float, bw: float) -> workspaces.ConvAt:
    config = (3, out, (3, 3), (1, 1), (1, 1), (1, 1), 1, True, "zeros")
    return workspaces.ConvAt(nn.Conv2d, config, (8, 3, 32, 32), False, False, fw, bw)


def test_a_workspace_lifts_the_peak_only_by_what_it_adds_above_the_step():
    a, b = conv_at(16, fw=40.0, bw=90.0), conv_at(32, fw=60.0, bw=70.0)
    sizes = {a.config: (5.0, 30.0), b.config: (0.0, 10.0)}
    calls = []

    def measure(conv, device, amp_dtype):
        calls.append(conv.config)
        return sizes[conv.config]

    cpu = torch.device("cpu")
    # a's backward: 90 held + 30 of workspace = 120, 20 above the step's 100
    assert workspaces.above_step_peak_mb([a, b, a], 100.0, cpu, None, measure) == pytest.approx(20.0)
    assert calls == [a.config, b.config]  # the same convolution at the same shape: measured once
    assert workspaces.above_step_peak_mb([a, b], 130.0, cpu, None, measure) == 0.0  # all below the peak


def test_the_plan_adds_the_measured_workspaces_to_the_allocator_peak_only(monkeypatch):
    sizes = (1000, 200)
    plain = memory_plan.predict(simplecnn(32), sizes=sizes)
    assert plain["workspace_mb"] == [None]  # no GPU beside this plan (or a CPU cell)
    monkeypatch.setattr(memory_plan, "workspace_on_this_gpu", lambda spec, peak, convs: 37.5)
    lifted = memory_plan.predict(simplecnn(32), sizes=sizes)
    assert lifted["workspace_mb"] == [37.5]
    assert lifted["allocated_mb"] == [pytest.approx(plain["allocated_mb"][0] + 37.5)]
    assert lifted["peak_mb"] == plain["peak_mb"]  # the tracker's split is what the tracker measures


def test_a_cpu_cell_measures_no_workspace():
    _, _, convs = fake_step.tracked_fake_step(simplecnn(8), Task.image(3, 32, 10), 8)
    assert fake_step.workspace_on_this_gpu(simplecnn(8, "cpu"), 10.0, convs) is None


def test_a_cuda_cell_gets_cublas_once_and_the_convolutions_lift(monkeypatch, capsys):
    _, _, convs = fake_step.tracked_fake_step(simplecnn(8), Task.image(3, 32, 10), 8)
    measured = []

    def blas(device, amp_dtype):
        measured.append(device)
        return 64.0

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(workspaces, "_BLAS", {})
    monkeypatch.setattr(workspaces, "blas_workspaces_mb", blas)
    monkeypatch.setattr(workspaces, "above_step_peak_mb", lambda convs, peak, device, amp_dtype: 20.0)
    assert fake_step.workspace_on_this_gpu(simplecnn(8, "cuda"), 10.0, convs) == 84.0
    assert fake_step.workspace_on_this_gpu(simplecnn(16, "cuda"), 10.0, convs) == 84.0
    assert fake_step.workspace_on_this_gpu(simplecnn(16, "cuda"), 10.0, []) == 64.0  # no convolution
    # the process keeps cuBLAS's workspaces: measured (and said) once
    assert measured == [torch.device("cuda", 0)]
    assert capsys.readouterr().out.count("cuBLAS's workspaces on cuda:0: 64.0 MB") == 1


def test_a_gpu_that_cannot_run_the_convolutions_leaves_the_workspace_unmeasured(monkeypatch, capsys):
    _, _, convs = fake_step.tracked_fake_step(simplecnn(8), Task.image(3, 32, 10), 8)

    def full(*args):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(workspaces, "_BLAS", {torch.device("cuda", 0): 64.0})
    monkeypatch.setattr(workspaces, "above_step_peak_mb", full)
    assert fake_step.workspace_on_this_gpu(simplecnn(8, "cuda"), 10.0, convs) is None
    assert "workspaces not measured: CUDA out of memory" in capsys.readouterr().out


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("batch", [128, 256])
def test_on_a_gpu_the_predicted_lift_is_what_cudnn_adds_to_a_real_step(batch):
    import torch.nn.functional as F

    from dpstudy.models.simplecnn import SimpleCNN

    model = SimpleCNN(3, 32, 10).cuda()
    optimizer = torch.optim.Adam(model.parameters())
    x, y = torch.randn(batch, 3, 32, 32, device="cuda"), torch.randint(0, 10, (batch,), device="cuda")

    def step_mb(cudnn: bool) -> float:
        torch.backends.cudnn.enabled = cudnn
        try:
            for _ in range(2):  # the first: one-off allocations (cuBLAS's workspace) no step repeats
                optimizer.zero_grad(set_to_none=True)
                torch.cuda.synchronize()
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                F.cross_entropy(model(x), y).backward()
                optimizer.step()
                torch.cuda.synchronize()
            return (torch.cuda.max_memory_allocated() - base) / 2**20
        finally:
            torch.backends.cudnn.enabled = True

    adds = step_mb(True) - step_mb(False)
    parts, _, convs = fake_step.tracked_fake_step(simplecnn(batch, "cuda"), Task.image(3, 32, 10), batch)
    predicted = workspaces.above_step_peak_mb(convs, parts["peak"], torch.device("cuda", 0))
    assert predicted == pytest.approx(adds, abs=max(5.0, 0.1 * adds))


# A fresh process: the plan's prediction of one device's step (tracker, cuBLAS, cuDNN), then that
# step for real, its max_memory_allocated beside it (the batch itself exists before the step)
PLAN_THEN_STEP = """
import json, sys, torch
import torch.nn.functional as F
from dpstudy.data.task import Task
from dpstudy.workflow import fake_step
from dpstudy.models.simplecnn import SimpleCNN
from dpstudy.study.spec import complete
batch = int(sys.argv[1])
spec = complete({"dataset": "synthetic_rgb", "model": "simplecnn", "mode": "single", "batch": batch, "device": "cuda"})
parts, _, convs = fake_step.tracked_fake_step(spec, Task.image(3, 32, 10), batch)
workspace = fake_step.workspace_on_this_gpu(spec, parts["peak"], convs)
model = SimpleCNN(3, 32, 10).cuda()
optimizer = torch.optim.Adam(model.parameters())
x, y = torch.randn(batch, 3, 32, 32, device="cuda"), torch.randint(0, 10, (batch,), device="cuda")
for _ in range(2):  # the plan's step is the second: Adam's state exists
    optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    F.cross_entropy(model(x), y).backward()
    optimizer.step()
    torch.cuda.synchronize()
batch_mb = (x.numel() * x.element_size() + y.numel() * y.element_size()) / 2**20
allocated = torch.cuda.max_memory_allocated() / 2**20
print(json.dumps({"predicted": parts["peak"] + workspace + batch_mb, "allocated": allocated}))
"""


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("batch", [128, 1024])
def test_on_a_gpu_the_plan_predicts_the_allocators_peak_of_a_fresh_process(batch):
    import json
    import subprocess
    import sys

    from helpers import REPO

    out = subprocess.run([sys.executable, "-c", PLAN_THEN_STEP, str(batch)], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    made = json.loads(out.stdout.strip().splitlines()[-1])
    assert made["predicted"] == pytest.approx(made["allocated"], rel=0.05), made
