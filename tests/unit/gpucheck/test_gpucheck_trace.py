"""gpu-check's trace item (dpstudy.gpucheck.trace) on a CPU: the same two ranks under torchrun on
device cpu, fewer samples; the figures it reports and how they read the capture's trace."""

import pytest

from dpstudy import models
from dpstudy.data.task import Task
from dpstudy.gpucheck import registry, trace


@pytest.mark.slow
def test_the_two_rank_trace_runs_on_a_cpu_and_gives_every_figure_of_the_registry(tmp_path):
    result = trace.measure(tmp_path, device="cpu", samples=(1024, 256))
    figures = result["figures"]
    assert set(figures) == {f.key for f in registry.BY_NAME["trace"].figures}
    # on a CPU compute comes from the operators: the target that asks for kernels is missed, said so
    assert figures["from_kernels"] is False and figures["parts_add_up"] and figures["files_kept"]
    assert result["data"]["steps"] == trace.STEPS and result["data"]["reason"] is None
    assert 0 < figures["compute_ms"] < figures["step_ms"] and figures["exposed_comm_ms"] >= 0
    # LeNet's gradients in one bucket: one all-reduce a step of every parameter in fp32
    lenet = models.build("lenet", Task.image(1, 28, 10), {})
    assert figures["all_reduce_calls"] == 1
    assert figures["all_reduce_mb"] == pytest.approx(sum(p.numel() for p in lenet.parameters()) * 4 / 1e6)
    assert (tmp_path / "cell/trace/rank0.json.gz").exists() and (tmp_path / "cell/trace/rank1.json.gz").exists()


def test_a_trace_without_figures_reads_as_missed_targets():
    blank = {"steps": 8, "pace_rank": None, "step_s": None, "compute_s": None, "exposed_comm_s": None,
             "data_wait_s": None, "idle_s": None, "overlap": None, "collectives": None, "reason": "rank 0: no trace",
             "ranks": [{"rank": 0, "file": None}, {"rank": 1, "file": None}]}  # fmt: skip
    result = trace.trace_result(blank)
    assert result["figures"]["parts_add_up"] is False and result["figures"]["files_kept"] is False
    assert result["figures"]["step_ms"] is None and result["details"]["reason"] == "rank 0: no trace"
