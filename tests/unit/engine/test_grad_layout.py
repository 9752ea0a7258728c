"""The gradient's layout (dpstudy.engine.grad_layout) from a model on the meta device, against what real
DDP builds: its reducer's rebuilt buckets after the first steps, in one Gloo process."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision

from dpstudy import models
from dpstudy.data.task import Task
from dpstudy.engine import grad_layout as layout
from dpstudy.engine import modes
from dpstudy.study import spec as specs


def resnet18() -> nn.Module:
    torch.manual_seed(0)
    return torchvision.models.resnet18(num_classes=10)


@pytest.fixture(scope="module")
def gloo_group():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("cap", [None, 25, 5])
def test_ddp_buckets_are_the_ones_ddp_rebuilds(gloo_group, cap):
    ddp = nn.parallel.DistributedDataParallel(resnet18(), bucket_cap_mb=cap)
    for _ in range(3):  # the reducer rebuilds its buckets after the first backward (logged after)
        ddp(torch.randn(2, 3, 32, 32)).sum().backward()
    rebuilt = [int(n) for n in ddp._get_ddp_logging_data()["rebuilt_bucket_sizes"].split(", ")]
    planned = layout.ddp_buckets(layout.on_meta(resnet18), cap)
    assert planned == rebuilt and sum(planned) == layout.nbytes(ddp.parameters())
    # the cases differ: the default's small first bucket, a cap given, a smaller cap
    expected_count = {None: 3, 25: 2, 5: 6}[cap]
    assert len(planned) == expected_count


def test_a_small_model_is_one_bucket_and_fsdp_units_cover_every_parameter():
    lenet = layout.on_meta(lambda: models.build("lenet", Task.image(1, 28, 10)))
    assert all(p.is_meta for p in lenet.parameters())
    total = layout.nbytes(lenet.parameters())
    assert layout.ddp_buckets(lenet) == [total]
    units = layout.fsdp_units(lenet)
    assert sum(units) == total and len(units) >= 3  # its convolutions and linear layers, each a unit
    net = layout.on_meta(resnet18)
    units = layout.fsdp_units(net)
    # stem conv, 8 blocks (4 layers x 2), fc; the root keeps bn1: 10 units and the root
    assert len(units) == 11 and sum(units) == layout.nbytes(net.parameters())
    assert units[-1] == layout.nbytes(net.bn1.parameters())


def test_the_ddp_mode_hands_the_studys_knobs_to_ddp_and_leaves_the_rest_at_its_defaults(gloo_group):
    spec = specs.complete({"dataset": "synthetic", "model": "lenet", "mode": "ddp", "gpus": 1, "backend": "gloo"})
    env = {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_WORLD_SIZE": "1"}
    knobs = {"bucket_cap_mb": 0.01, "gradient_as_bucket_view": True, "broadcast_buffers": False, "static_graph": True}
    mode = modes.mode_for({**spec, **knobs}, env)
    assert mode.options == knobs and modes.mode_for(spec, env).options == {}
    build = lambda: models.build("lenet", Task.image(1, 28, 10))  # noqa: E731
    ddp = mode.wrap(build(), None)
    assert ddp.bucket_bytes_cap == int(0.01 * layout.MIB) and ddp.gradient_as_bucket_view and ddp.static_graph
    assert not ddp.broadcast_buffers
    plain = modes.mode_for(spec, env).wrap(build(), None)
    assert plain.bucket_bytes_cap == 25 * layout.MIB and not plain.gradient_as_bucket_view and plain.broadcast_buffers
    small = modes.mode_for({**spec, "bucket_cap_mb": 0.01}, env).wrap(build(), None)
    for _ in range(3):
        small(torch.randn(4, 1, 28, 28)).sum().backward()
    rebuilt = [int(n) for n in small._get_ddp_logging_data()["rebuilt_bucket_sizes"].split(", ")]
    assert rebuilt == layout.ddp_buckets(layout.on_meta(build), 0.01) and len(rebuilt) > 1
