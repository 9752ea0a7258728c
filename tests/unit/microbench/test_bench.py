"""Benchmark tests: a --quick run in process and the helpers. The CLIs run in full in the default
study (tests/e2e/test_default_study.py asserts their rows). No timing is asserted; only that every
row is there and the ratios are computed."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from helpers.bench import assert_kernel_rows

import dpstudy.ext
from dpstudy.analysis import step_model
from dpstudy.ext import reference
from dpstudy.microbench import comm, kernels
from dpstudy.microbench.loops import max_pool2d_backward_loop, rgb_to_grayscale_loop
from dpstudy.util.busfactors import bus_factor

CUDA = torch.cuda.is_available()


def test_loops_compute_what_the_operators_compute():
    image = torch.randint(0, 256, (3, 6, 5), dtype=torch.uint8)
    assert torch.equal(rgb_to_grayscale_loop(image, rows=3)[:, :3], reference.rgb_to_grayscale(image)[:, :3])
    x = torch.randn(2, 3, 6, 8, requires_grad=True)
    out = F.max_pool2d(x, 2)
    grad = torch.randn_like(out)
    (expected,) = torch.autograd.grad(out, x, grad)
    got = max_pool2d_backward_loop(grad, x.detach(), 2, 2, planes=4)
    torch.testing.assert_close(got.view(6, 6, 8)[:4], expected.view(6, 6, 8)[:4])
    assert not got.view(6, 6, 8)[4:].any()


def test_speedups_compare_within_op_and_shape():
    df = pd.DataFrame(
        {
            "op": ["a", "a", "a", "b"],
            "shape": ["s"] * 4,
            "impl": ["python_loop", "pytorch", "extension", "extension"],
            "device": ["cpu"] * 4,
            "median_s": [10.0, 0.5, 0.1, 1.0],
        }
    )
    out = kernels.add_speedups(df.reindex(columns=kernels.COLUMNS[:-2]))
    np.testing.assert_allclose(out.speedup_vs_loop[:3], [1, 20, 100])
    np.testing.assert_allclose(out.speedup_vs_pytorch[:3], [0.05, 1, 5])
    assert out.speedup_vs_loop.isna()[3]


def test_kernel_bench_quick_times_every_case_in_process(ext_test_dir):
    # The CLI (scripts/kernel_bench.py, its CSV and figure) runs in the default study:
    # tests/e2e/test_default_study.py asserts its rows. Here the --quick cases, in process.
    df = kernels.run(dpstudy.ext.load(ext_test_dir), quick=True)
    assert_kernel_rows(df)
    full = {(c.op, c.shape, c.impl) for c in kernels.all_cases(dpstudy.ext.load(ext_test_dir), quick=False)}
    assert set(zip(df.op, df["shape"], df.impl)) == full  # quick times the same cases, briefly


def test_a_quick_comm_run_stops_at_4_mib():
    # The full run's rows: tests/e2e/test_default_study.py (its comm_bench job)
    assert comm.sizes_to_time(quick=False) == comm.SIZES == [4096 * 4**k for k in range(9)]
    assert comm.sizes_to_time(quick=True) == [4096 * 4**k for k in range(6)]
    assert comm.iterations(4 << 20, quick=True) == (2, 10)
    assert comm.iterations(256 << 20, quick=False) == (1, 3) and comm.iterations(4096, quick=False) == (5, 50)
    assert comm.iterations(64 << 20, quick=False) == (1, 3) and comm.iterations(16 << 20, quick=False) == (1, 12)
    assert comm.iterations(4 << 20, quick=False) == (5, 48) and comm.iterations(1 << 20, quick=False) == (5, 50)


def _as_rank(monkeypatch, rank: int, world_size: int) -> None:
    monkeypatch.setattr(comm.dist, "get_rank", lambda: rank)
    monkeypatch.setattr(comm.dist, "get_world_size", lambda: world_size)


@pytest.mark.parametrize("rank", [0, 1])
def test_comm_checks_catch_a_result_from_the_wrong_rank_or_chunk(monkeypatch, rank):
    """Rank `rank` of 2, with each collective played by hand: what the other rank holds is known
    from the inputs' rule, so the right result passes the check and near misses do not."""
    _as_rank(monkeypatch, rank, 2)
    other = 1 - rank

    def gather(fill):
        def call(out, inp):
            fill(out.view(2, -1), inp)

        return call

    def right(out, inp):
        out[rank], out[other] = inp, inp / (rank + 1) * (other + 1)

    def own_twice(out, inp):
        out[:] = inp

    def swapped(out, inp):
        out[other], out[rank] = inp, inp / (rank + 1) * (other + 1)

    for fill, ok in ((right, True), (own_twice, False), (swapped, False)):
        monkeypatch.setattr(comm, "_ALL_GATHER", gather(fill))
        size, call, check = comm.collective_call("all_gather", 4096, torch.device("cpu"))
        call()
        assert size == 4096 and check() is ok, fill.__name__

    def scatter(pick, total):
        # rank r's input chunk j is (j + 1)(r + 1): the sum over both ranks is 3/(r + 1) times r's own
        def call(out, inp):
            mine = inp.view(2, -1)[pick]
            out.copy_(mine * 3 / (rank + 1) if total else mine)

        return call

    for pick, total, ok in ((rank, True, True), (other, True, False), (rank, False, False)):
        monkeypatch.setattr(comm, "_REDUCE_SCATTER", scatter(pick, total))
        size, call, check = comm.collective_call("reduce_scatter", 4096, torch.device("cpu"))
        call()
        assert size == 4096 and check() is ok, (pick, total)


def test_comm_a_wrong_result_reports_no_bandwidth(tmp_path, monkeypatch):
    """In a real (one-rank Gloo) group: a collective that runs but computes garbage gets a reason,
    and no time; the real one is timed."""
    from dpstudy.engine.modes.distributed import destroy_process_group

    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        cpu = torch.device("cpu")
        for collective in comm.COLLECTIVES:
            good = comm._time_size(collective, 16384, cpu, "gloo", quick=True)
            assert good["bytes"] == 16384 and good["median_s"] > 0 and "reason" not in good, good
            assert good["stream_s"] > 0  # the same calls back to back, no barrier between them
        monkeypatch.setattr(comm, "_ALL_GATHER", lambda out, inp: out.zero_())
        monkeypatch.setattr(comm, "_REDUCE_SCATTER", lambda out, inp: out.copy_(inp[: out.numel()] + 1))
        for collective in ("all_gather", "reduce_scatter"):
            bad = comm._time_size(collective, 16384, cpu, "gloo", quick=True)
            assert "median_s" not in bad and "wrong result" in bad["reason"], bad
    finally:
        destroy_process_group()


def test_comm_bus_factors_and_sizes():
    assert bus_factor("all_reduce", 2) == 1.0 and bus_factor("all_reduce", 4) == 1.5
    assert bus_factor("all_gather", 4) == bus_factor("reduce_scatter", 4) == 0.75
    assert bus_factor("all_gather", 1) == 0.0
    # one definition: comm_bench's busbw and the step model's ring use the same function
    assert comm.bus_factor is step_model.bus_factor is bus_factor


def test_comm_helpers():
    assert comm.size_label(4096) == "4 KiB" and comm.size_label(256 << 20) == "256 MiB"
    if torch.cuda.device_count() < 2:
        assert "GPU" in comm.reason("nccl", "cuda", 2) or "CUDA" in comm.reason("nccl", "cuda", 2)
    assert comm.reason("gloo", "cpu", 2) is None


def comm_rows(world: int) -> pd.DataFrame:
    """comm.csv's rows of one run at `world` ranks, bandwidths generated (Gloo on CPU, and the CUDA
    combinations not run)."""
    sizes = [4096, 1 << 20, 64 << 20]
    ran = pd.DataFrame(
        [
            {"collective": c, "backend": "gloo", "device": "cpu", "bytes": n, "median_s": 1e-4 + n / 1e9 * world}
            for c in comm.COLLECTIVES
            for n in sizes
        ]
    )
    skipped = pd.DataFrame([{"collective": "all_reduce", "backend": "nccl", "device": "cuda", "bytes": 4096}])
    df = pd.concat([ran, skipped.assign(reason="no CUDA device")], ignore_index=True).reindex(columns=comm.COLUMNS)
    df["world_size"], df["size"] = world, df["bytes"].map(comm.size_label)
    df["busbw_gbps"] = df.bytes / df.median_s / 1e9 * df.collective.map(lambda c: bus_factor(c, world))
    return df


def test_a_sweep_over_world_sizes_is_one_table_and_its_figure_a_row_of_panels_per_size(tmp_path, monkeypatch):
    from dpstudy.microbench import figures

    asked = []
    monkeypatch.setattr(comm, "run", lambda quick, world, combos: asked.append((quick, world)) or comm_rows(world))
    df = comm.sweep([2, 4], quick=True)
    assert asked == [(True, 2), (True, 4)] and list(df.columns) == comm.COLUMNS
    assert df.groupby("world_size").size().to_dict() == {2: 10, 4: 10}
    df.to_csv(tmp_path / "comm.csv", index=False)
    drawn = {}
    monkeypatch.setattr(figures, "_save", lambda grid, png: drawn.update(grid=grid))
    figures.comm_figure(tmp_path / "comm.csv", tmp_path / "comm.png")
    grid = drawn["grid"]
    assert grid.axes.shape == (2, 3)  # a row per world size, a panel per collective
    titles = [[ax.get_title() for ax in row] for row in grid.axes]
    assert titles[1] == [f"{c}, 4 processes" for c in comm.COLLECTIVES] and titles[0][0] == "all_reduce, 2 processes"
    for row, world in zip(grid.axes, (2, 4), strict=True):
        (line,) = [ln for ln in row[0].get_lines() if len(ln.get_xdata())]  # gloo on cpu: its own sizes
        want = df[(df.world_size == world) & (df.collective == "all_reduce") & df.reason.isna()]
        assert np.allclose(sorted(line.get_ydata()), sorted(want.busbw_gbps))
    title = grid.figure._suptitle.get_text()
    assert title.startswith("Collectives across 2 and 4 processes") and "nccl/cuda (no CUDA device)" in title
