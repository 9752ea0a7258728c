"""The collectives' latency + size / bandwidth fits (dpstudy.analysis.comm_fit) on generated sweeps."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dpstudy.analysis import comm_fit
from dpstudy.microbench import comm

SIZES = np.array(comm.SIZES, dtype=float)  # 4 KiB .. 256 MiB, as comm_bench times them


def sweep(latency_s: float, gbps: float, noise: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (latency_s + SIZES / (gbps * 1e9)) * np.exp(rng.normal(0, noise, len(SIZES)))


@pytest.mark.parametrize("latency_s, gbps", [(30e-6, 2.0), (5e-6, 150.0), (400e-6, 0.5)])
def test_a_fit_recovers_the_latency_and_bandwidth_it_was_generated_with(latency_s, gbps):
    exact = comm_fit.fit_line(SIZES, sweep(latency_s, gbps, 0.0, 0))
    assert exact.latency_s == pytest.approx(latency_s, rel=1e-6) and exact.bandwidth_gbps == pytest.approx(gbps)
    assert np.abs(exact.residuals).max() < 1e-9
    # 3 % noise per point, as a median over iterations scatters: both terms within a few per cent
    for seed in range(5):
        noisy = comm_fit.fit_line(SIZES, sweep(latency_s, gbps, 0.03, seed))
        assert noisy.latency_s == pytest.approx(latency_s, rel=0.1)
        assert noisy.bandwidth_gbps == pytest.approx(gbps, rel=0.05)
        assert 0.005 < np.sqrt(np.mean(noisy.residuals**2)) < 0.06


def test_the_small_messages_count_as_much_as_the_large_ones():
    # Plain least squares fits the 256 MiB point and leaves 4 KiB's latency wrong by several x; the
    # relative fit keeps every point within its noise.
    times = sweep(50e-6, 2.0, 0.0, 0)
    times[0] *= 1.02
    fit = comm_fit.fit_line(SIZES, times)
    assert fit.time(SIZES[0]) == pytest.approx(times[0], rel=0.03)
    assert fit.time(SIZES[-1]) == pytest.approx(times[-1], rel=0.01)


def test_neither_term_goes_negative():
    # Times flat in size (a latency-bound backend), with the largest a little faster: an unconstrained
    # fit would give a negative per-byte time
    times = np.full(len(SIZES), 1e-3)
    times[-1] = 0.9e-3
    fit = comm_fit.fit_line(SIZES, times)
    assert fit.latency_s > 0 and fit.seconds_per_byte >= 0 and fit.time(SIZES[-1] * 4) >= fit.time(SIZES[0])


def test_too_few_or_bad_points_are_an_error():
    with pytest.raises(ValueError, match="3 or more"):
        comm_fit.fit_line(SIZES[:2], [1e-4, 2e-4])
    with pytest.raises(ValueError, match="positive and finite"):
        comm_fit.fit_line(SIZES[:3], [1e-4, float("nan"), 2e-4])


def test_the_table_fits_each_collective_and_world_size_apart_and_skips_reasoned_rows():
    rows = []
    truth = {("all_reduce", 2): (40e-6, 2.0), ("all_reduce", 4): (90e-6, 1.5), ("all_gather", 2): (30e-6, 3.0)}
    for (collective, n), (latency, gbps) in truth.items():
        times = sweep(latency, gbps, 0.0, 1)
        rows += [
            {
                "collective": collective,
                "backend": "gloo",
                "device": "cpu",
                "world_size": n,
                "bytes": int(s),
                "median_s": t,
                "reason": None,
            }
            for s, t in zip(SIZES, times, strict=True)
        ]
    rows += [
        {
            "collective": "all_reduce",
            "backend": "nccl",
            "device": "cuda",
            "world_size": 2,
            "bytes": int(s),
            "median_s": None,
            "reason": "no CUDA device",
        }
        for s in SIZES
    ]
    fits = comm_fit.fit_table(pd.DataFrame(rows))
    assert list(fits.columns) == list(comm_fit.COLUMNS)
    table = fits.set_index(["collective", "world_size"])
    assert set(table.index) == set(truth) and set(table["backend"]) == {"gloo"}
    for key, (latency, gbps) in truth.items():
        row = table.loc[key]
        assert row["latency_s"] == pytest.approx(latency) and row["bandwidth_gbps"] == pytest.approx(gbps)
        assert row["points"] == 9 and row["min_bytes"] == 4096 and row["max_bytes"] == 256 << 20
        assert comm_fit.predicted_time(row, 1 << 20) == pytest.approx(latency + (1 << 20) / (gbps * 1e9))


def test_the_fits_read_the_back_to_back_calls_where_the_sweep_has_them():
    # one call after a barrier at twice the latency of the calls back to back, as Gloo on 2 vCPUs
    back_to_back, barrier = sweep(40e-6, 2.0, 0.0, 1), sweep(80e-6, 2.0, 0.0, 1)
    rows = [
        {"collective": "all_reduce", "backend": "gloo", "device": "cpu", "world_size": 2, "bytes": int(s),
         "median_s": b, "stream_s": t, "reason": None}
        for s, t, b in zip(SIZES, back_to_back, barrier, strict=True)
    ]  # fmt: skip
    (fit,) = comm_fit.fit_table(pd.DataFrame(rows)).to_dict("records")
    assert fit["latency_s"] == pytest.approx(40e-6) and fit["bandwidth_gbps"] == pytest.approx(2.0)
    # a sweep made before comm_bench timed them back to back: its one-call times
    (old,) = comm_fit.fit_table(pd.DataFrame(rows).drop(columns="stream_s")).to_dict("records")
    assert old["latency_s"] == pytest.approx(80e-6)
