"""The reduction of a rank's trace (dpstudy.engine.trace_figures) on hand-made Chrome-trace events
whose answer is known: the partition of a step into data wait, compute, exposed communication and
idle time; what counts as compute on a CPU and on a device; the collectives' calls and bytes."""

import json
import math
from pathlib import Path

import pytest

from dpstudy.engine import trace_figures as tf

MAIN, GLOO = 10, 11  # the training thread and one of Gloo's


def op(name, ts, dur, tid=MAIN, cat="cpu_op", **args):
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "args": args}


def step(ts, dur):
    return op(tf.STEP, ts, dur, cat="user_annotation")


def ddp_step(at):
    """A 100 us step: data 0-5, forward 10-30 (addmm inside linear), backward 30-60 whose last 20 us
    run beside the all-reduce (40-80, on Gloo's thread), then the wait for it until 80 (no operator),
    and the optimizer 85-95."""
    return [
        step(at, 100),
        op(tf.DATA, at, 5, cat="user_annotation"),
        op("aten::index_select", at + 1, 3),  # the device loader's indexing: data, not compute
        op("aten::linear", at + 10, 20),
        op("aten::addmm", at + 12, 17),
        op("autograd::engine::evaluate_function: AddmmBackward0", at + 30, 30),
        op("AddmmBackward0", at + 30, 30),
        op("aten::mm", at + 31, 28),
        op("c10d::allreduce_", at + 40, 1),  # the enqueue on the training thread: not compute
        op(
            "gloo:all_reduce",
            at + 40,
            40,
            tid=GLOO,
            cat="user_annotation",
            **{"Input Dims": [[1000]], "Input type": ["float"]},
        ),  # fmt: skip
        op("aten::div_", at + 78, 2, tid=GLOO),  # Gloo's own thread: never the step's compute
        op("Optimizer.step#Adam.step", at + 85, 10, cat="user_annotation"),
        op("aten::_foreach_add_", at + 85, 10),
    ]


def test_a_ddp_step_is_split_into_data_compute_exposed_communication_and_idle():
    events = ddp_step(0) + ddp_step(200)
    figures = tf.reduce(events)
    assert figures["steps"] == 2 and figures["activity"] == "cpu"
    us = 1e-6
    # data 0-5; compute 10-30, 31-59, 85-95 (the addmm inside linear counted once; the autograd
    # node's edges 30-31 and 59-60 are not an operator's); the all-reduce 40-80 runs beside compute
    # until 59, then alone until 80: exposed 21 us
    assert figures["step_s"] == pytest.approx(100 * us)
    assert figures["data_wait_s"] == pytest.approx(5 * us)
    assert figures["compute_s"] == pytest.approx((20 + 28 + 10) * us)
    assert figures["exposed_comm_s"] == pytest.approx(21 * us)
    assert figures["comm_s"] == pytest.approx(40 * us)
    assert figures["overlap"] == pytest.approx(1 - 21 / 40)
    parts = sum(figures[k] for k in ("data_wait_s", "compute_s", "exposed_comm_s", "idle_s"))
    assert parts == pytest.approx(figures["step_s"]) and figures["idle_s"] == pytest.approx(16 * us)
    assert figures["collectives"] == {"all_reduce": {"calls": 1.0, "bytes": 4000.0, "seconds": pytest.approx(40 * us)}}


def test_a_hook_waiting_for_its_collective_is_not_compute():
    # FSDP's post-backward hook: a Python autograd node that enqueues a reduce-scatter and waits for
    # it, with no operator running meanwhile; the wait is exposed communication
    events = [
        step(0, 100),
        op("aten::mm", 0, 40),
        op("autograd::engine::evaluate_function: RegisterPostBackwardFunctionBackward", 40, 50),
        op("RegisterPostBackwardFunctionBackward", 40, 50),
        op("fsdp::chunk_cat", 41, 4),
        op("c10d::_reduce_scatter_base_", 45, 1),
        op("gloo:all_reduce", 46, 44, tid=GLOO, cat="user_annotation"),
        op("_c10d_functional::wait_tensor", 50, 40),  # a wait, if one shows as an operator
        op("aten::add_", 92, 8),
    ]
    figures = tf.reduce(events)
    assert figures["compute_s"] == pytest.approx(52e-6)  # mm 40, chunk_cat 4, add_ 8
    # in flight from its issue at 45 (Gloo's thread took it up at 46) to its end at 90
    assert figures["exposed_comm_s"] == pytest.approx(45e-6) and figures["overlap"] == pytest.approx(0.0)
    # Gloo's span says no size here: the bytes are unknown, never 0
    assert figures["collectives"]["all_reduce"]["bytes"] is None


def test_a_collective_is_in_flight_from_its_issue_though_gloo_takes_it_up_later():
    # a busy CPU: Gloo's thread starts the all-reduce 30 us after the training thread issued it and
    # went on to wait; the wait from the issue is exposed communication, not idle time
    events = [
        step(0, 100),
        op("aten::mm", 0, 40),
        op("c10d::allreduce_", 40, 1),
        op("gloo:all_reduce", 70, 30, tid=GLOO, cat="user_annotation"),
    ]
    figures = tf.reduce(events)
    assert figures["exposed_comm_s"] == pytest.approx(60e-6) and figures["idle_s"] == pytest.approx(0.0)
    assert figures["comm_s"] == pytest.approx(60e-6)
    assert figures["collectives"]["all_reduce"]["seconds"] == pytest.approx(30e-6)  # as Gloo ran it
    # an issue without its span (counts that differ): the spans alone
    figures = tf.reduce([*events, op("c10d::allreduce_", 90, 1)])
    assert figures["exposed_comm_s"] == pytest.approx(30e-6) and figures["idle_s"] == pytest.approx(30e-6)


def test_on_a_device_the_kernels_compute_and_nccl_kernels_communicate():
    events = [
        step(0, 100),
        op("aten::mm", 0, 5),  # the host's launches: not the device's compute
        op("volta_sgemm_128x64", 5, 50, tid=7, cat="kernel"),
        op("Memcpy HtoD (Pageable -> Device)", 0, 5, tid=7, cat="gpu_memcpy"),
        op("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 40, 40, tid=8, cat="kernel"),
        op("nccl:all_reduce", 39, 1, cat="user_annotation", **{"In msg nelems": 2048, "dtype": "Float"}),
    ]
    figures = tf.reduce(events)
    assert figures["activity"] == "cuda"
    assert figures["compute_s"] == pytest.approx(55e-6)  # the copy 0-5 and the GEMM 5-55
    assert figures["exposed_comm_s"] == pytest.approx(25e-6)  # 55-80
    assert figures["idle_s"] == pytest.approx(20e-6)
    assert figures["collectives"] == {"all_reduce": {"calls": 1.0, "bytes": 8192.0, "seconds": pytest.approx(40e-6)}}


def test_a_collective_across_two_steps_counts_in_each_by_its_share():
    events = [step(0, 50), step(50, 50), op("aten::mm", 0, 30), op("gloo:all_gather", 40, 20, tid=GLOO, cat="x")]
    figures = tf.reduce(events)
    # 10 us in each step, exposed in both: a mean of 10 us per step; the call counts where it started
    assert figures["exposed_comm_s"] == pytest.approx(10e-6) and figures["comm_s"] == pytest.approx(10e-6)
    assert figures["collectives"]["all_gather"]["calls"] == 0.5


def test_interval_arithmetic():
    assert tf.union([(5, 7), (0, 2), (1, 3), (7, 8), (9, 9)]) == [(0, 3), (5, 8)]
    assert tf.minus([(0, 10)], [(2, 3), (5, 12)]) == [(0, 2), (3, 5)]
    assert tf.clip([(0, 4), (6, 9)], 3, 7) == [(3, 4), (6, 7)]
    assert tf.collective_of("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL") == "reduce_scatter"
    assert tf.collective_of("gloo:all_gather") == "all_gather" and tf.collective_of("aten::mm") is None
    assert math.isnan(tf.nbytes(op("gloo:broadcast", 0, 1, **{"Input Dims": [[4]], "Input type": ["quint8"]})))
    # a scalar (ZeRO's all-reduce of the gradients' norm) is one element, not unknown
    assert tf.nbytes(op("gloo:all_reduce", 0, 1, **{"Input Dims": [[]], "Input type": ["double"]})) == 8
    assert math.isnan(tf.nbytes(op("gloo:all_reduce", 0, 1, **{"Input Dims": [], "Input type": ["double"]})))


def test_a_trace_without_a_step_names_what_is_missing():
    with pytest.raises(ValueError, match="no 'dpstudy:step' span"):
        tf.reduce([op("aten::mm", 0, 5)])


def test_past_the_bound_every_rank_drops_its_file_and_keeps_its_figures(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from dpstudy.engine import tracing

    events = ddp_step(0)

    def traced_steps(trainer, steps, raw):  # as the profiler exports them
        Path(raw).write_text(json.dumps({"traceEvents": events}))
        return events

    monkeypatch.setattr(tracing, "traced_steps", traced_steps)
    peer = {**tf.reduce(events), "rank": 1, "file": "trace/rank1.json.gz", "bytes": 400, "reason": None}
    mode = SimpleNamespace(rank=0, all_gather_objects=lambda mine: [mine, dict(peer)])
    trainer = SimpleNamespace(mode=mode, spec={"trace_steps": None, "gpus": 2, "nodes": 1})
    kept = tracing.capture(trainer, tmp_path)
    assert kept["steps"] == tracing.DEFAULT_STEPS and (tmp_path / "trace/rank0.json.gz").exists()
    assert [r["file"] for r in kept["ranks"]] == ["trace/rank0.json.gz", "trace/rank1.json.gz"] and kept[
        "reason"
    ] is None
    size = (tmp_path / "trace/rank0.json.gz").stat().st_size
    monkeypatch.setattr(tracing, "MAX_BYTES", size + 399)  # the two together pass it by a byte
    dropped = tracing.capture(trainer, tmp_path)
    assert not (tmp_path / "trace/rank0.json.gz").exists() and [r["file"] for r in dropped["ranks"]] == [None, None]
    assert dropped["reason"].startswith("the cell's traces took ") and dropped["reason"].endswith(": figures only")
    assert dropped["step_s"] == kept["step_s"] == pytest.approx(100e-6)  # the figures stay


def test_the_figures_are_the_median_steps_so_one_slow_step_moves_nothing():
    slow = [step(400, 300), op("aten::mm", 400, 290)]  # a hiccup: 300 us, nearly all compute
    figures = tf.reduce(ddp_step(0) + ddp_step(200) + slow + ddp_step(800))
    assert figures["steps"] == 4 and figures["step_s"] == pytest.approx(100e-6)
    assert figures["compute_s"] == pytest.approx(58e-6) and figures["exposed_comm_s"] == pytest.approx(21e-6)
    # the lengths 100, 100, 100, 300: quartiles 100 and 150
    assert figures["step_spread_s"] == pytest.approx(50e-6)
    # the collectives' means per step count every step, the slow one too (it made none)
    assert figures["collectives"]["all_reduce"]["calls"] == 0.75
