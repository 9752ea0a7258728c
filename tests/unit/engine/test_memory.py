"""One training step's memory split by PyTorch's tracker (dpstudy.engine.memory), against sizes
known from the model and the optimizer."""

import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from dpstudy import models
from dpstudy.data.task import Task
from dpstudy.engine import memory


def lenet_step(optimizer_name: str):
    torch.manual_seed(0)
    model = models.build("lenet", Task.image(1, 28, 10))
    optimizer = (
        torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        if optimizer_name == "sgd"
        else torch.optim.Adam(model.parameters())
    )
    x, y = torch.randn(32, 1, 28, 28), torch.randint(0, 10, (32,))

    def step():
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()

    return model, optimizer, step


@pytest.mark.parametrize("optimizer_name, states", [("sgd", 1), ("adam", 2)])
def test_the_split_adds_up_and_holds_the_models_and_optimizers_sizes(optimizer_name, states):
    model, optimizer, step = lenet_step(optimizer_name)
    step()  # as after training: the optimizer's state exists
    (device, parts), *others = memory.tracked_step(model, optimizer, step).items()
    assert device == torch.device("cpu") and others == []
    params_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / memory.MB
    assert parts["params"] == pytest.approx(params_mb, rel=1e-9)  # LeNet has no buffers
    # momentum: one copy of the parameters; Adam: two, plus a step counter per parameter
    assert parts["optimizer"] == pytest.approx(states * params_mb, rel=1e-3)
    assert 0 < parts["grads"] <= params_mb * (1 + 1e-9)  # at the peak, backward may not have made them all
    assert parts["activations"] > parts["params"]  # a batch of 32 keeps more for backward than LeNet weighs
    assert parts["peak"] == pytest.approx(sum(parts[p] for p in memory.PARTS))


def test_categories_fold_into_four_parts_and_a_new_one_is_not_lost():
    snapshot = {"PARAM": 1 * memory.MB, "GRAD": 2 * memory.MB, "OPT": 3 * memory.MB, "ACT": 4 * memory.MB}
    snapshot |= {"ALL_GATHER": 5 * memory.MB, "SOMETHING_NEW": 6 * memory.MB, "Total": 21 * memory.MB}
    assert memory.split(snapshot) == {"params": 6, "grads": 2, "optimizer": 3, "activations": 10, "peak": 21}


def test_on_a_cpu_the_step_reads_how_much_the_resident_memory_grew():
    # In a process of its own, as a cell's rank: a test worker's heap may hold freed pages a step
    # reuses (a full run read 0.0 MiB here once), which a fresh process does not.
    code = """
import json, torch
from dpstudy.engine.memory import host_step
def step():  # three 64 MiB tensors alive at once, touched (randn writes every page)
    held = [torch.randn(4096, 4096) for _ in range(3)]
    return float(sum(t[0, 0] for t in held))
first, growth = host_step(step)
_, nothing = host_step(lambda: None)
print(json.dumps([isinstance(first, float), growth, nothing]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    is_float, growth, nothing = json.loads(out)
    assert is_float
    # the peak was reset before the step: 192 MiB and the allocator's rounding, not the process's history
    assert 190 <= growth["rss_growth_mb"] <= 260, growth
    assert 0 <= nothing["rss_growth_mb"] < 5
