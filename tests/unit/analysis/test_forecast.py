"""DDP forecasts (dpstudy.analysis.calibration) on records generated from the model's own law: the
leave-one-out recovers every held-out setting, never reads it, and extrapolation widens the interval."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from helpers.records import CURRENT, comm_fit, make_record

from dpstudy.analysis import calibration, forecast_table, memory, stats, step_model
from dpstudy.analysis.tables import cells_table

FIXED_S, PER_SAMPLE_S = 2e-3, 5e-5  # t1(b) = FIXED_S + PER_SAMPLE_S b
# two ranks' slow-down of one device's step on the shared host; what DDP adds to every step; the
# share of the all-reduce the step left exposed
SHARE, DDP_FIXED_S, EXPOSED = 1.3, 1e-3, 0.4
LATENCY_S, GBPS, GRAD_BYTES = 50e-6, 1.0, 250_000  # the all-reduce fit at 2 ranks; LeNet's gradient
FITS = pd.DataFrame([comm_fit(LATENCY_S, GBPS)])
ALLREDUCE_S = LATENCY_S + GRAD_BYTES / (GBPS * 1e9)


def t1(b: float) -> float:
    return FIXED_S + PER_SAMPLE_S * b


def ddp_step(global_batch: int, n: int = 2, share: float = SHARE, comm_s: float = ALLREDUCE_S) -> float:
    """The step model's law (dpstudy.analysis.step_model)."""
    b = global_batch / n
    return t1(b) * share + DDP_FIXED_S + EXPOSED * comm_s


# Memory per device, MB, the tracker's split: parameters, gradients, optimizer state, activations;
# a DDP rank holds DDP_EXTRA_MB more (its buckets), off by DDP_WOBBLE_MB at some batches
PARAMS_MB, ACT_MB_PER_SAMPLE, DDP_EXTRA_MB = 1.0, 0.1, 1.0
DDP_WOBBLE_MB = {64: 0.0, 128: 0.05, 256: -0.05, 512: 0.0}


def split(b: float, ddp_extra: float = 0.0) -> list[tuple[float, float, float, float]]:
    return [(PARAMS_MB, PARAMS_MB + ddp_extra, 2 * PARAMS_MB, ACT_MB_PER_SAMPLE * b)]


def records(ddp_throughput: dict[int, float] | None = None, ddp_batches=(64, 128, 256, 512)) -> list[dict]:
    """Single devices at 64, 128 and 256; DDP on 2 ranks at `ddp_batches` (throughput overridable),
    two repeats each, within 1 % of the law; each with its memory split."""
    out = []
    for b in (64, 128, 256):
        for k, wobble in enumerate((0.99, 1.01)):
            out.append(
                make_record(samples_per_s=b / t1(b) * wobble, batch=b, repeat=k, suffix=f"-r{k}", memory=split(b))
            )
    for batch in ddp_batches:
        measured = (ddp_throughput or {}).get(batch, batch / ddp_step(batch))
        exposed = EXPOSED * ALLREDUCE_S
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
                    memory=split(batch / 2, DDP_EXTRA_MB + DDP_WOBBLE_MB.get(batch, 0.0)) * 2,
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
    table = forecast_table.leave_one_out(settings, cells, FITS)
    assert list(table.columns) == [*forecast_table.COLUMNS, "noise_cv"] and (table["source"] == "leave-one-out").all()
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
    batches = (64, 128, 256, 512, 1024)
    settings, cells = tables(records(ddp_batches=batches))
    odd = records({128: 128 / ddp_step(128) / 2}, batches)  # B 128 measured at half the law
    before = forecast_table.leave_one_out(settings, cells, FITS).set_index("global_batch")
    after = forecast_table.leave_one_out(*tables(odd), FITS).set_index("global_batch")
    # its own forecast does not move; its error does; the others' stay right (each calibrates on the
    # repeated median of the rest: one odd setting among four moves none of them)
    assert after.loc[128, "predicted_samples_per_s"] == pytest.approx(before.loc[128, "predicted_samples_per_s"])
    assert after.loc[128, "error"] == pytest.approx(1.0, abs=0.01)
    assert after.drop(128)["error"].abs().max() < 0.002
    # and with its records gone altogether, the model of the others gives it the same forecast
    without = [
        r for r in records(ddp_batches=batches) if not (r["spec"]["mode"] == "ddp" and r["spec"]["batch"] == 128)
    ]
    single, ddp = calibration.calibration_inputs(*tables(without))
    model = calibration.Calibration(single, ddp, FITS)
    alone = model.forecast("ddp", "gloo", "cpu", 2, 128)["predicted_samples_per_s"]
    assert alone == pytest.approx(before.loc[128, "predicted_samples_per_s"])


def test_more_ranks_than_measured_extrapolate_the_share_and_the_ring_and_widen_the_interval():
    single, ddp = calibration.calibration_inputs(*tables(records()))
    model = calibration.Calibration(single, ddp, FITS)
    four = model.forecast("ddp", "gloo", "cpu", 4, 256)
    # share grows linearly from 1 at one rank through 2 ranks' 1.3, DDP's fixed cost stays; the ring
    # all-reduce over 4
    share = 1 + (SHARE - 1) * 3
    ring = LATENCY_S * 3 + GRAD_BYTES * 2 * 3 / 4 / (GBPS * 1e9)
    assert 256 / four["predicted_samples_per_s"] == pytest.approx(ddp_step(256, 4, share, ring), rel=0.01)
    assert four["how"] == "extrapolated" and "4 ranks extrapolated from 2" in four["basis"]
    two = model.forecast("ddp", "gloo", "cpu", 2, 256)
    assert two["how"] == "interpolated" and two["distance"] == 0 and four["distance"] == 1
    low2, high2 = calibration.interval(1.0, 0.03, two["distance"])
    low4, high4 = calibration.interval(1.0, 0.03, four["distance"])
    assert high4 - low4 == pytest.approx(2 * (high2 - low2), rel=0.05)  # twice as wide, one doubling away


def test_a_forecast_group_no_ddp_setting_calibrates_is_an_error_naming_it():
    single, ddp = calibration.calibration_inputs(*tables(records()))
    model = calibration.Calibration(single, ddp, FITS)
    with pytest.raises(LookupError, match="no measured DDP setting over nccl"):
        model.forecast("ddp", "nccl", "cuda", 2, 256)
    with pytest.raises(LookupError, match="no all_reduce fit for gloo on cuda"):
        model.forecast("ddp", "gloo", "cuda", 2, 256)


def test_compiled_cells_calibrate_only_compiled_forecasts():
    # The same study with its single devices also compiled, twice as fast: the eager DDP settings are
    # still recovered from the eager line alone (mixed in, the compiled cells would halve t1), and
    # with no compiled DDP setting nothing compiled is held out or forecast.
    compiled = [
        make_record(samples_per_s=2 * b / t1(b) * w, batch=b, repeat=k, suffix=f"-r{k}", memory=split(b), compile=True)
        for b in (64, 128, 256)
        for k, w in enumerate((0.99, 1.01))
    ]
    settings, cells = tables(records() + compiled)
    assert settings["compile"].astype(bool).sum() == 3
    requests = [{"mode": "ddp", "gpus": 4, "nodes": 1, "batch": 256, "backend": "gloo", "dataset": None, "model": None}]
    table = forecast_table.forecasts(settings, cells, FITS, requests)
    held_out = table[table["source"] == "leave-one-out"]
    assert sorted(held_out["global_batch"]) == [64, 128, 256, 512] and not held_out["compile"].astype(bool).any()
    assert held_out["error"].abs().max() < 0.002, held_out[["global_batch", "error"]]
    asked = table[table["source"] == "requested"]
    assert len(asked) == 1 and not bool(asked["compile"].iloc[0])
    share, ring = 1 + (SHARE - 1) * 3, LATENCY_S * 3 + GRAD_BYTES * 2 * 3 / 4 / (GBPS * 1e9)
    assert 256 / asked["predicted_samples_per_s"].iloc[0] == pytest.approx(ddp_step(256, 4, share, ring), rel=0.01)


def test_requested_forecasts_use_every_setting_and_say_which_they_cannot_make():
    settings, cells = tables(records())
    requests = [
        {"mode": "ddp", "gpus": 4, "nodes": 1, "batch": 256, "backend": "gloo", "dataset": None, "model": None},
        {"mode": "ddp", "gpus": 2, "nodes": 1, "batch": 256, "backend": "nccl", "dataset": None, "model": None},
        {"mode": "ddp", "gpus": 4, "nodes": 1, "batch": 256, "backend": "gloo", "dataset": None, "model": ["vit"]},
    ]
    table = forecast_table.forecasts(settings, cells, FITS, requests)
    asked = table[table["source"] == "requested"].set_index("backend")
    assert len(table[table["source"] == "leave-one-out"]) == 4 and len(asked) == 2  # vit: no such forecast group
    share, ring = 1 + (SHARE - 1) * 3, LATENCY_S * 3 + GRAD_BYTES * 2 * 3 / 4 / (GBPS * 1e9)
    assert 256 / asked.loc["gloo", "predicted_samples_per_s"] == pytest.approx(ddp_step(256, 4, share, ring), rel=0.01)
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
    assert forecast_table.forecasts(settings, cells, no_fits, []).empty
    (row,) = forecast_table.forecasts(settings, cells, no_fits, [request]).to_dict("records")
    assert row["how"] == "not forecast" and row["basis"] == "no all_reduce fit for gloo on cpu (comm_bench)"


def test_memory_per_device_is_the_single_device_line_at_the_per_device_batch_plus_ddps_own():
    recs = records()
    settings, cells = tables(recs)
    measured = memory.measured_rows([(None, r) for r in recs])
    request = {"mode": "ddp", "gpus": 4, "nodes": 1, "batch": 256, "backend": "gloo", "dataset": None, "model": None}
    table = forecast_table.forecasts(settings, cells, FITS, [request], measured).set_index("source")
    held = table.loc[["leave-one-out"]].set_index("global_batch")
    # each held-out setting: the line at its per-device batch plus the others' median extra (1.0 MB
    # or 1.05): off by its own wobble at most, and never by nothing at all
    law = {b: 4 * PARAMS_MB + ACT_MB_PER_SAMPLE * b / 2 + DDP_EXTRA_MB + DDP_WOBBLE_MB[b] for b in DDP_WOBBLE_MB}
    assert held["measured_memory_mb"].to_dict() == pytest.approx(law)
    assert 0 < held["memory_error"].abs().max() < 0.01
    assert (held["predicted_memory_low"] < held["predicted_memory_mb"]).all()
    asked = table.loc["requested"]  # 4 ranks at 256: 64 per device
    expected = 4 * PARAMS_MB + ACT_MB_PER_SAMPLE * 64 + DDP_EXTRA_MB
    assert asked["predicted_memory_mb"] == pytest.approx(expected, abs=0.05)
    assert asked["predicted_memory_low"] < asked["predicted_memory_mb"] < asked["predicted_memory_high"]
    # 4 ranks extrapolate from 2: the interval is twice as wide (log scale) as an interpolated one's
    inside = held.loc[256]
    spread = math.log(asked["predicted_memory_high"] / asked["predicted_memory_mb"])
    assert spread == pytest.approx(2 * math.log(inside["predicted_memory_high"] / inside["predicted_memory_mb"]))


def test_without_measured_memory_a_forecast_has_none():
    settings, cells = tables([{**r, "memory": None} for r in records()])
    table = forecast_table.forecasts(settings, cells, FITS, [], None)
    assert len(table) == 4 and table["predicted_memory_mb"].isna().all()
    assert table["predicted_memory_low"].isna().all() and table["memory_error"].isna().all()


# --- FSDP: the same law with its own collectives, per unit -----------------------------------------
UNITS, GATHER_LATENCY_S, SCATTER_LATENCY_S = 4, 80e-6, 60e-6  # LeNet's units; the two fits' latencies
SHARE_FSDP, EXPOSED_FSDP = 1.4, 0.7


def fit_row(collective: str, latency_s: float) -> dict:
    return comm_fit(latency_s, GBPS, collective)


ALL_FITS = pd.DataFrame(
    [FITS.iloc[0].to_dict(), fit_row("all_gather", GATHER_LATENCY_S), fit_row("reduce_scatter", SCATTER_LATENCY_S)]
)


def fsdp_comm(shard: str, n: int = 2) -> float:
    """FSDP's collectives per step at 2 ranks by the fits: UNITS messages each."""
    gather = UNITS * GATHER_LATENCY_S + GRAD_BYTES / (GBPS * 1e9)
    scatter = UNITS * SCATTER_LATENCY_S + GRAD_BYTES / (GBPS * 1e9)
    return (2 if shard == "full" else 1) * gather + scatter


def fsdp_records(shard: str, batches=(64, 128, 256)) -> list[dict]:
    out = []
    for batch in batches:
        exposed = EXPOSED_FSDP * fsdp_comm(shard)
        step = t1(batch / 2) * SHARE_FSDP + exposed
        probe = {
            "sync_step_s": 0.01 + exposed,
            "nosync_step_s": 0.01,
            "grad_bytes": GRAD_BYTES,
            "gather_bytes": GRAD_BYTES,
            "units": UNITS,
        }
        for k, wobble in enumerate((0.99, 1.01)):
            out.append(
                make_record(
                    samples_per_s=batch / step * wobble,
                    mode="fsdp",
                    shard=shard,
                    gpus=2,
                    backend="gloo",
                    batch=batch,
                    probe=probe,
                    memory=[(PARAMS_MB / 2, PARAMS_MB / 2, PARAMS_MB, ACT_MB_PER_SAMPLE * batch / 2 + 0.5)] * 2,
                    repeat=k,
                    suffix=f"-shard{shard}-r{k}",
                )
            )
    return out


def with_units(recs: list[dict]) -> list[dict]:
    """The DDP records' probes with the layout a current probe records (1 bucket, UNITS units)."""
    return [{**r, "probe": {**r["probe"], "buckets": 1, "units": UNITS}} if r["probe"] else r for r in recs]


def test_a_held_out_fsdp_setting_is_recovered_from_its_kind_and_priced_per_unit():
    recs = with_units(records()) + fsdp_records("full") + fsdp_records("grad_op")
    settings, cells = tables(recs)
    table = forecast_table.leave_one_out(settings, cells, ALL_FITS, memory.measured_rows([(None, r) for r in recs]))
    fsdp = table[table["mode"] == "fsdp"]
    assert sorted(zip(fsdp["shard"], fsdp["global_batch"])) == [
        (s, b) for s in ("full", "grad_op") for b in (64, 128, 256)
    ]
    assert fsdp["error"].abs().max() < 0.002, fsdp[["shard", "global_batch", "error"]]
    row = fsdp.set_index(["shard", "global_batch"]).loc[("grad_op", 128)]
    assert row["basis"] == "3 single-device batch(es); 2 FSDP grad_op setting(s) at n=2"
    # full moves one all-gather more per step than grad_op: the forecasts differ by it
    full = fsdp.set_index(["shard", "global_batch"]).loc[("full", 128)]
    gather = UNITS * GATHER_LATENCY_S + GRAD_BYTES / (GBPS * 1e9)
    step = 128 / full["predicted_samples_per_s"] - 128 / row["predicted_samples_per_s"]
    assert step == pytest.approx(EXPOSED_FSDP * gather, rel=0.02)
    # memory: the single-device state split over 2 ranks, the activations of 64, FSDP's own 0.5 MB
    assert full["predicted_memory_mb"] == pytest.approx(4 * PARAMS_MB / 2 + ACT_MB_PER_SAMPLE * 64 + 0.5, rel=0.01)


def test_an_fsdp_setting_none_of_its_kind_calibrates_borrows_ddps_share_and_overlap():
    settings, cells = tables(with_units(records()))
    single, multi = calibration.calibration_inputs(settings, cells)
    model = calibration.Calibration(single, multi, ALL_FITS)
    made = model.forecast("fsdp grad_op", "gloo", "cpu", 2, 128)
    assert 128 / made["predicted_samples_per_s"] == pytest.approx(ddp_step(128, comm_s=fsdp_comm("grad_op")), rel=0.01)
    assert made["how"] == "extrapolated"
    assert "no fsdp grad_op setting ran: DDP's host share and overlap" in made["basis"]
    # priced per unit: 4 units cost 3 more latencies per collective than one message would
    one_unit = calibration.Calibration(single, multi.assign(units=1), ALL_FITS)
    one_unit = one_unit.forecast("fsdp grad_op", "gloo", "cpu", 2, 128)
    slower = 128 / made["predicted_samples_per_s"] - 128 / one_unit["predicted_samples_per_s"]
    assert slower == pytest.approx(EXPOSED * 3 * (GATHER_LATENCY_S + SCATTER_LATENCY_S), rel=0.01)
    with pytest.raises(LookupError, match="no measured FSDP full or DDP setting over nccl"):
        model.forecast("fsdp full", "nccl", "cpu", 2, 128)
    with pytest.raises(LookupError, match="dp is not forecast"):
        model.forecast("dp", "gloo", "cpu", 2, 128)


def test_ddp_buckets_are_priced_each_with_its_latency():
    settings, cells = tables(records())
    single, multi = calibration.calibration_inputs(settings, cells)
    one = calibration.Calibration(single, multi, FITS).forecast("ddp", "gloo", "cpu", 4, 256)
    three = calibration.Calibration(single, multi.assign(buckets=3), FITS)
    # calibrated on the same steps, three buckets price the all-reduce higher, so less of it is
    # exposed (more of it hidden) at 2 ranks; at 4 ranks the ring's latency counts three times
    assert three.layout["buckets"] == 3 and three.calibrated[("ddp", "gloo", 2)]["overlap"] > 1 - EXPOSED
    ring3 = 3 * LATENCY_S * 3 + GRAD_BYTES * 2 * 3 / 4 / (GBPS * 1e9)
    exposed3 = EXPOSED * ALLREDUCE_S / (3 * LATENCY_S + GRAD_BYTES / (GBPS * 1e9))
    made = three.forecast("ddp", "gloo", "cpu", 4, 256)
    step = ddp_step(256, 4, 1 + (SHARE - 1) * 3, 0) + exposed3 * ring3
    assert 256 / made["predicted_samples_per_s"] == pytest.approx(step, rel=0.01)
    assert made["predicted_samples_per_s"] != pytest.approx(one["predicted_samples_per_s"], rel=1e-3)


def test_the_strategies_table_ranks_a_requested_forecast_beside_what_ran():
    from dpstudy.analysis import strategies, strategy_forecasts

    recs = with_units(records())
    settings, cells = tables(recs)
    split = memory.split_table(memory.measured_rows([(None, r) for r in recs]), None, cells)
    requests = [
        {"mode": m, "shard": s, "gpus": 4, "nodes": 1, "batch": 256, "backend": "gloo", "dataset": None, "model": None}
        for m, s in (("ddp", "none"), ("fsdp", "full"))
    ]
    made = forecast_table.forecasts(settings, cells, ALL_FITS, requests, split)
    ranked = strategies.strategies_table(cells, settings, pd.DataFrame(), split)
    table = strategy_forecasts.with_forecasts(ranked, made)
    assert len(table) == len(ranked) + 2 and table["forecast"].sum() == 2
    measured = table[~table["forecast"]].reset_index(drop=True)
    pd.testing.assert_frame_equal(measured.drop(columns=["forecast", "rank_with_forecasts"]), ranked, check_dtype=False)
    # both join the workload of global batch 256 (one device and DDP on 2 ran it), after its rows
    workload = table[table["global_batch"] == 256]
    assert list(workload["forecast"]) == [False, False, True, True]
    ddp4 = workload[workload["forecast"] & (workload["mode"] == "ddp")].iloc[0]
    asked = made[(made["source"] == "requested") & (made["mode"] == "ddp")].iloc[0]
    assert ddp4["samples_per_s"] == asked["predicted_samples_per_s"] and ddp4["status"] == "forecast"
    assert ddp4["gpus"] == ddp4["devices"] == 4 and ddp4["reason"] == asked["basis"]
    assert pd.isna(ddp4["rank"]) and not ddp4["fastest"] and ddp4["vs_one_device"] == asked["predicted_speedup"]
    # ranked with the measured ones by throughput: DDP on 4 beats DDP on 2 (the law's share grows
    # slower than the devices), which beats one device; FSDP's 3 x 4 messages cost it the lead
    order = workload.sort_values("rank_with_forecasts")
    assert [(r["mode"], r["devices"]) for _, r in order.iterrows()][0] == ("ddp", 4)
    fsdp4 = workload[workload["mode"] == "fsdp"].iloc[0]
    assert fsdp4["shard"] == "full" and fsdp4["samples_per_s"] < ddp4["samples_per_s"]
    assert sorted(workload["rank_with_forecasts"]) == [1, 2, 3, 4]
    # the measured ranks are untouched: 1 and 2 among what ran
    assert sorted(workload["rank"].dropna()) == [1, 2] and workload["fastest"].sum() == 1


def test_the_study_accepts_in_forecast_every_scheme_the_model_prices_and_no_other():
    from dpstudy.study import forecast_requests, modes
    from dpstudy.util.errors import ConfigError

    assert set(step_model.MESSAGES) == {"ddp", "fsdp full", "fsdp grad_op", *(f"deepspeed zero{s}" for s in (1, 2, 3))}
    assert set(step_model.MESSAGES) < set(modes.schemes())
    for name in modes.schemes():
        facts, made = modes.of_scheme(name)
        item = {"mode": [facts.name], "gpus": [2], "batch": [64], "backend": ["gloo"]}
        if made.shard != modes.NO_SHARD:
            item["shard"] = [made.shard]
        if name in step_model.MESSAGES:
            (request,) = forecast_requests.requests({"forecast": [item]})
            assert modes.scheme_name(request["mode"], request["shard"]) == name
        else:
            with pytest.raises(ConfigError, match=rf"forecast #1: mode '?{facts.name}'? .*cannot be forecast"):
                forecast_requests.requests({"forecast": [item]})


def test_on_cuda_memory_is_forecast_and_checked_as_the_allocator_holds_it():
    """CUDA cells record max_memory_allocated beyond the tracked step (workspaces, resident data,
    buckets): a forecast adds the forecast group's median of it, unsharded, and is checked against the
    allocator's peak, not the tracker's."""
    recs = records()
    for r in recs:
        peaks = r["memory"]["peak_mb"]
        per_device = r["spec"]["batch"] // len(peaks)
        r["memory"]["allocated_mb"] = [p + 150.0 + per_device / 64 for p in peaks]  # what the tracker misses
    settings, cells = tables(recs)
    split = memory.measured_rows([(None, r) for r in recs])
    on_cpu = forecast_table.leave_one_out(
        *tables(records()), FITS, memory.measured_rows([(None, r) for r in records()])
    )
    held = forecast_table.leave_one_out(settings, cells, FITS, split)
    assert len(held) == len(on_cpu) > 0
    # measured: the allocator's peak, the tracker's plus its gap; predicted: the tracker's line plus
    # the median gap, so every error stays within the gaps' spread
    assert (held["measured_memory_mb"].to_numpy() > on_cpu["measured_memory_mb"].to_numpy() + 150).all()
    shift = held["predicted_memory_mb"].to_numpy() - on_cpu["predicted_memory_mb"].to_numpy()
    # each the median gap of the other settings (leave-one-out reads not its own): within the gaps' range
    assert ((150.5 <= shift) & (shift <= 158)).all()
    assert held["memory_error"].abs().max() < 0.05


@pytest.mark.parametrize("overlapped", [False, True])
def test_step_time_recovers_its_parameters_from_generated_timings(overlapped):
    from dpstudy.analysis.linefit import StepTime

    a, c = 0.003, 2e-5  # 3 ms fixed (host launches on CUDA), 20 µs per sample
    batches = [64, 128, 256, 512, 1024]
    seconds = [math.hypot(a, c * b) if overlapped else a + c * b for b in batches]
    fitted = StepTime.fit(batches, seconds, overlapped)
    assert (fitted.a, fitted.c, fitted.overlapped) == (pytest.approx(a), pytest.approx(c), overlapped)
    assert fitted(2048) == pytest.approx(math.hypot(a, c * 2048) if overlapped else a + c * 2048)
    # the other shape misses the bend: a line through the ends of overlapped times is too slow between
    other = StepTime.fit(batches[::4], seconds[::4], not overlapped)
    assert (other(256) > seconds[2]) if overlapped else (other(256) < seconds[2])
    # one batch: proportional, either way
    assert StepTime.fit([256], [0.01], overlapped)(512) == pytest.approx(0.02)


def test_on_cuda_a_forecast_group_bends_its_single_device_step_at_the_hosts_launch_time():
    from dpstudy.analysis.calibration import Calibration

    single = pd.DataFrame(
        {
            "global_batch": [128, 1024],
            "samples_per_s": [b / math.hypot(0.004, 1e-5 * b) for b in (128, 1024)],
            "memory_mb": math.nan,
        }
    )
    empty = pd.DataFrame(columns=["scheme", "global_batch", "devices", "memory_mb", "backend"])
    on_cuda = Calibration(single.assign(env_device="cuda"), empty, pd.DataFrame())
    on_cpu = Calibration(single.assign(env_device="cpu"), empty, pd.DataFrame())
    assert on_cuda.t1(512) == pytest.approx(math.hypot(0.004, 1e-5 * 512))
    assert on_cpu.t1(512) == pytest.approx(on_cpu.t1(128) + (on_cpu.t1(1024) - on_cpu.t1(128)) * 384 / 896)
    assert on_cuda.t1(128) == on_cpu.t1(128)  # a measured batch is its measurement


def test_a_host_share_that_extrapolates_below_zero_is_no_forecast():
    # DDP on 2 ranks measured far faster than one device allows (a loaded machine's noise): the
    # calibrated host share is under 1, and carried to 8 ranks the model's step would be negative
    fast = {b: 8 * b / ddp_step(b) for b in (64, 128, 256, 512)}
    single, multi = calibration.calibration_inputs(*tables(records(fast)))
    model = calibration.Calibration(single, multi, FITS)
    assert model.calibrated[("ddp", "gloo", 2)]["share"] < 1 - 1 / 7
    assert model.forecast("ddp", "gloo", "cpu", 2, 256)["predicted_samples_per_s"] > 0
    with pytest.raises(LookupError, match=r"the model's step at n=8 is -[\d.]+ ms \(host share -[\d.]+"):
        model.forecast("ddp", "gloo", "cpu", 8, 256)
