"""A study that traces needs a PyTorch whose profiler the reduction reads: an error naming
trace_steps, the cell and the version where the study is planned, before any job."""

import pytest

from dpstudy.engine import tracing
from dpstudy.study import sweeps
from dpstudy.util.errors import ConfigError
from dpstudy.workflow import traces


def cells(grid: dict, **settings) -> list:
    sweep = {"name": "s", "dataset": "synthetic", "model": "lenet", "grid": grid, "set": settings}
    return sweeps.expand(sweeps.load({"study": "t", "sweeps": [sweep]}))


def test_multi_device_cells_trace_by_default_and_single_device_cells_when_asked():
    ddp, single = cells({"mode": ["ddp"], "gpus": [2], "backend": ["gloo"]}), cells({"mode": ["single"]})
    assert [tracing.steps_of(c.spec) for c in ddp] == [tracing.DEFAULT_STEPS]
    assert [tracing.steps_of(c.spec) for c in single] == [0]
    assert [tracing.steps_of(c.spec) for c in cells({"mode": ["single"]}, trace_steps=3)] == [3]
    assert [
        tracing.steps_of(c.spec) for c in cells({"mode": ["ddp"], "gpus": [2], "backend": ["gloo"]}, trace_steps=0)
    ] == [0]


def test_an_old_pytorch_is_refused_only_where_a_cell_traces():
    ddp = cells({"mode": ["ddp"], "gpus": [2], "backend": ["gloo"]})
    with pytest.raises(
        ConfigError, match=r"^trace_steps: cell synthetic-lenet-ddp-g2-b64-gloo traces 8 steps.*1\.13\.1"
    ):
        traces.check(ddp, version="1.13.1")
    traces.check(ddp, version="2.11.0+cu130")  # the GPU image's
    traces.check(
        cells({"mode": ["ddp"], "gpus": [2], "backend": ["gloo"]}, trace_steps=0), version="1.13.1"
    )  # nothing traced
    traces.check(cells({"mode": ["single"]}), version="1.13.1")
    assert traces.torch_version() is not None  # this environment's, from its metadata
