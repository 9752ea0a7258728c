"""DDP forecasts (dpstudy.analysis.forecast) on records generated from the model's own law: the
leave-one-out recovers every held-out setting, never reads it, and extrapolation widens the interval."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from helpers.records import CURRENT, make_record

from dpstudy.analysis import forecast, memory, predictions, stats
from dpstudy.analysis.tables import cells_table

FIXED_S, PER_SAMPLE_S = 2e-3, 5e-5  # t1(b) = FIXED_S + PER_SAMPLE_S b
SHARE, HIDDEN = 1.3, 0.4  # two ranks' slow-down on the shared host; the all-reduce left exposed
LATENCY_S, GBPS, GRAD_BYTES = 50e-6, 1.0, 250_000  # the all-reduce fit at 2 ranks; LeNet's gradient
FITS = pd.DataFrame(
    [
        {
            "collective": "all_reduce",
            "backend": "gloo",
            "device": "cpu",
            "world_size": 2,
            "points": 9,
            "min_bytes": 4096,
            "max_bytes": 256 << 20,
            "latency_s": LATENCY_S,
            "bandwidth_gbps": GBPS,
            "rel_rmse": 0.02,
            "max_rel_error": 0.04,
        }
    ]
)
ALLREDUCE_S = LATENCY_S + GRAD_BYTES / (GBPS * 1e9)


def t1(b: float) -> float:
    return FIXED_S + PER_SAMPLE_S * b


def ddp_step(global_batch: int, n: int = 2) -> float:
    return t1(global_batch / n) * SHARE + HIDDEN * ALLREDUCE_S


# Memory per device, MB, the tracker's split: parameters, gradients, optimizer state, activations;
# a DDP rank holds DDP_EXTRA_MB more (its buckets), off by DDP_WOBBLE_MB at some batches
PARAMS_MB, ACT_MB_PER_SAMPLE, DDP_EXTRA_MB = 1.0, 0.1, 1.0
DDP_WOBBLE_MB = {64: 0.0, 128: 0.05, 256: -0.05, 512: 0.0}


def split(b: float, ddp_extra: float = 0.0) -> list[tuple[float, float, float, float]]:
    return [(PARAMS_MB, PARAMS_MB + ddp_extra, 2 * PARAMS_MB, ACT_MB_PER_SAMPLE * b)]


def records(ddp_throughput: dict[int, float] | None = None) -> list[dict]:
    """Single devices at 64, 128 and 256; DDP on 2 ranks at 64 ... 512 (throughput overridable),
    two repeats each, within 1 % of the law; each with its memory split."""
    out = []
    for b in (64, 128, 256):
        for k, wobble in enumerate((0.99, 1.01)):
            out.append(
                make_record(samples_per_s=b / t1(b) * wobble, batch=b, repeat=k, suffix=f"-r{k}", memory=split(b))
            )
    for batch in (64, 128, 256, 512):
        measured = (ddp_throughput or {}).get(batch, batch / ddp_step(batch))
        exposed = HIDDEN * ALLREDUCE_S
        probe = {"sync_step_s": 0.01 + exposed, "nosync_step_s": 0.01, "allreduce_s": 0.001, "grad_bytes": GRAD_BYTES}
        for k, wobble in enumerate((0.99, 1.01)):
            out.append(
                make_record(
                    samples_per_s=measured * wobble,
                    mode="ddp",
                    gpus=2,
                    backend="gloo",
                    batch=batch,
                    probe=probe,
                    memory=split(batch / 2, DDP_EXTRA_MB + DDP_WOBBLE_MB[batch]) * 2,
                    repeat=k,
                    suffix=f"-r{k}",
                )
            )
    return out


def tables(recs):
    cells = cells_table([(f"results/cells/{r['cell']}/record.json", r) for r in recs], CURRENT["source_hash"])
    return stats.settings_table(cells), cells


def test_every_held_out_setting_is_recovered_from_the_others():
    settings, cells = tables(records())
    table = predictions.leave_one_out(settings, cells, FITS)
    assert list(table.columns) == [*predictions.COLUMNS, "noise_cv"] and (table["source"] == "leave-one-out").all()
    assert sorted(table["global_batch"]) == [64, 128, 256, 512] and (table["devices"] == 2).all()
    # within the repeats' 1 % wobble (the geometric mean of 0.99 and 1.01 is 0.99995)
    assert table["error"].abs().max() < 0.002, table[["global_batch", "error"]]
    # B 64 is 32 per rank, B 512 256: 32 lies outside the single devices' 64-256, so it extrapolates
    how = dict(zip(table["global_batch"], table["how"], strict=True))
    assert how == {64: "extrapolated", 128: "interpolated", 256: "interpolated", 512: "interpolated"}
    row = table.set_index("global_batch").loc[128]
    assert row["predicted_low"] < row["measured_samples_per_s"] < row["predicted_high"]
    assert row["predicted_speedup"] == pytest.approx(t1(128) / ddp_step(128), rel=0.01)
    assert "3 single-device batch(es); 3 DDP setting(s) at n=2" == row["basis"]


def test_leave_one_out_never_reads_the_held_out_setting():
    settings, cells = tables(records())
    slower, _ = tables(records({128: 128 / ddp_step(128) / 2}))  # B 128 measured at half the law
    before = predictions.leave_one_out(settings, cells, FITS).set_index("global_batch")
    after = predictions.leave_one_out(slower, tables(records({128: 128 / ddp_step(128) / 2}))[1], FITS)
    after = after.set_index("global_batch")
    # its own forecast does not move; its error does; the others' stay right (each calibrates on the
    # median of the rest: one odd setting among three moves none of them)
    assert after.loc[128, "predicted_samples_per_s"] == pytest.approx(before.loc[128, "predicted_samples_per_s"])
    assert after.loc[128, "error"] == pytest.approx(1.0, abs=0.01)
    assert after.drop(128)["error"].abs().max() < 0.002
    # and with its records gone altogether, the model of the others gives it the same forecast
    without = [r for r in records() if not (r["spec"]["mode"] == "ddp" and r["spec"]["batch"] == 128)]
    single, ddp = predictions.calibration_inputs(*tables(without))
    model = forecast.Workload(single, ddp, FITS)
    alone = model.forecast("gloo", "cpu", 2, 128, GRAD_BYTES)["predicted_samples_per_s"]
    assert alone == pytest.approx(before.loc[128, "predicted_samples_per_s"])


def test_more_ranks_than_measured_extrapolate_the_share_and_the_ring_and_widen_the_interval():
    single, ddp = predictions.calibration_inputs(*tables(records()))
    model = forecast.Workload(single, ddp, FITS)
    four = model.forecast("gloo", "cpu", 4, 256, GRAD_BYTES)
    # share grows linearly from 1 at one rank through 2 ranks' 1.3; the ring all-reduce over 4
    share = 1 + (SHARE - 1) * 3
    ring = LATENCY_S * 3 + GRAD_BYTES * 2 * 3 / 4 / (GBPS * 1e9)
    assert 256 / four["predicted_samples_per_s"] == pytest.approx(t1(64) * share + HIDDEN * ring, rel=0.01)
    assert four["how"] == "extrapolated" and "4 ranks extrapolated from 2" in four["basis"]
    two = model.forecast("gloo", "cpu", 2, 256, GRAD_BYTES)
    assert two["how"] == "interpolated" and two["distance"] == 0 and four["distance"] == 1
    low2, high2 = forecast.interval(1.0, 0.03, two["distance"])
    low4, high4 = forecast.interval(1.0, 0.03, four["distance"])
    assert high4 - low4 == pytest.approx(2 * (high2 - low2), rel=0.05)  # twice as wide, one doubling away


def test_a_workload_no_ddp_setting_calibrates_is_an_error_naming_it():
    single, ddp = predictions.calibration_inputs(*tables(records()))
    model = forecast.Workload(single, ddp, FITS)
    with pytest.raises(LookupError, match="no measured DDP setting over nccl"):
        model.forecast("nccl", "cuda", 2, 256, GRAD_BYTES)
    with pytest.raises(LookupError, match="no all_reduce fit for gloo on cuda"):
        model.forecast("gloo", "cuda", 2, 256, GRAD_BYTES)


def test_requested_forecasts_use_every_setting_and_say_which_they_cannot_make():
    settings, cells = tables(records())
    requests = [
        {"mode": "ddp", "gpus": 4, "nodes": 1, "batch": 256, "backend": "gloo", "dataset": None, "model": None},
        {"mode": "ddp", "gpus": 2, "nodes": 1, "batch": 256, "backend": "nccl", "dataset": None, "model": None},
        {"mode": "ddp", "gpus": 4, "nodes": 1, "batch": 256, "backend": "gloo", "dataset": None, "model": ["vit"]},
    ]
    table = predictions.predictions(settings, cells, FITS, requests)
    asked = table[table["source"] == "predict"].set_index("backend")
    assert len(table[table["source"] == "leave-one-out"]) == 4 and len(asked) == 2  # vit: no such workload
    share, ring = 1 + (SHARE - 1) * 3, LATENCY_S * 3 + GRAD_BYTES * 2 * 3 / 4 / (GBPS * 1e9)
    assert 256 / asked.loc["gloo", "predicted_samples_per_s"] == pytest.approx(t1(64) * share + HIDDEN * ring, rel=0.01)
    assert (
        asked.loc["gloo", "predicted_low"]
        < asked.loc["gloo", "predicted_samples_per_s"]
        < asked.loc["gloo", "predicted_high"]
    )
    assert pd.isna(asked.loc["gloo", "measured_samples_per_s"]) and asked.loc["gloo", "how"] == "extrapolated"
    assert asked.loc["nccl", "how"] == "not forecast" and pd.isna(asked.loc["nccl", "predicted_samples_per_s"])
    assert asked.loc["nccl", "basis"] == "no measured DDP setting over nccl calibrates it"


def test_without_the_all_reduce_fit_nothing_is_held_out_and_a_request_says_why():
    settings, cells = tables(records())
    request = {"mode": "ddp", "gpus": 4, "nodes": 1, "batch": 256, "backend": "gloo", "dataset": None, "model": None}
    no_fits = FITS.iloc[0:0]  # a study with bench comm: false
    assert predictions.predictions(settings, cells, no_fits, []).empty
    (row,) = predictions.predictions(settings, cells, no_fits, [request]).to_dict("records")
    assert row["how"] == "not forecast" and row["basis"] == "no all_reduce fit for gloo on cpu (comm_bench)"


def test_memory_per_device_is_the_single_device_line_at_the_per_device_batch_plus_ddps_own():
    recs = records()
    settings, cells = tables(recs)
    measured = memory.measured_rows([(None, r) for r in recs])
    request = {"mode": "ddp", "gpus": 4, "nodes": 1, "batch": 256, "backend": "gloo", "dataset": None, "model": None}
    table = predictions.predictions(settings, cells, FITS, [request], measured).set_index("source")
    held = table.loc[["leave-one-out"]].set_index("global_batch")
    # each held-out setting: the line at its per-device batch plus the others' median extra (1.0 MB
    # or 1.05): off by its own wobble at most, and never by nothing at all
    law = {b: 4 * PARAMS_MB + ACT_MB_PER_SAMPLE * b / 2 + DDP_EXTRA_MB + DDP_WOBBLE_MB[b] for b in DDP_WOBBLE_MB}
    assert held["measured_memory_mb"].to_dict() == pytest.approx(law)
    assert 0 < held["memory_error"].abs().max() < 0.01
    assert (held["predicted_memory_low"] < held["predicted_memory_mb"]).all()
    asked = table.loc["predict"]  # 4 ranks at 256: 64 per device
    expected = 4 * PARAMS_MB + ACT_MB_PER_SAMPLE * 64 + DDP_EXTRA_MB
    assert asked["predicted_memory_mb"] == pytest.approx(expected, abs=0.05)
    assert asked["predicted_memory_low"] < asked["predicted_memory_mb"] < asked["predicted_memory_high"]
    # 4 ranks extrapolate from 2: the interval is twice as wide (log scale) as an interpolated one's
    inside = held.loc[256]
    spread = math.log(asked["predicted_memory_high"] / asked["predicted_memory_mb"])
    assert spread == pytest.approx(2 * math.log(inside["predicted_memory_high"] / inside["predicted_memory_mb"]))


def test_without_measured_memory_a_forecast_has_none():
    settings, cells = tables([{**r, "memory": None} for r in records()])
    table = predictions.predictions(settings, cells, FITS, [], None)
    assert len(table) == 4 and table["predicted_memory_mb"].isna().all()
    assert table["predicted_memory_low"].isna().all() and table["memory_error"].isna().all()
