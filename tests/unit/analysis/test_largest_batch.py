"""Each strategy at the largest per-device batch that fits (dpstudy.analysis.largest_batch), on
records whose memory and throughput follow a known law: the line through a strategy's own batches
(measured or planned) or the step model's, the capacity and its margins, b*, and the throughput
there, measured or forecast."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from helpers.records import BUDGET_REASON, CURRENT, OOM_REASON, comm_fit, make_record

from dpstudy.analysis import largest_batch, memory, stats, utilisation
from dpstudy.analysis.tables import cells_table
from dpstudy.study.budget import GIB

FIXED_S, PER_SAMPLE_S = 2e-3, 5e-5  # one device's step: t1(b) = FIXED_S + PER_SAMPLE_S b
ACT_MB = 0.5  # activations per sample on a device
# per device: parameters, gradients, optimizer state; DDP keeps one gradient more (its buckets),
# FSDP half of one device's state and 5 MB of gathered units
ONE_DEVICE, REPLICA, SHARD = (10.0, 10.0, 20.0), (10.0, 20.0, 20.0), (5.0, 5.0, 10.0)
FITS = pd.DataFrame([comm_fit(50e-6, 1.0), comm_fit(80e-6, 1.0, "all_gather"), comm_fit(60e-6, 1.0, "reduce_scatter")])
PROBE = {"sync_step_s": 0.011, "nosync_step_s": 0.010, "grad_bytes": 250_000, "units": 4, "buckets": 1}


def t1(b: float) -> float:
    return FIXED_S + PER_SAMPLE_S * b


def single(batches=(64, 128), **keys) -> list[dict]:
    """One device at each batch, two repeats within 1 % of the law."""
    return [
        make_record(
            samples_per_s=b / t1(b) * wobble,
            batch=b,
            repeat=k,
            suffix=f"-r{k}",
            memory=[(*ONE_DEVICE, ACT_MB * b)],
            **keys,
        )
        for b in batches
        for k, wobble in enumerate((0.99, 1.01))
    ]


def multi(mode: str, batches=(128, 256), gpus: int = 2, **keys) -> list[dict]:
    """DDP or FSDP (full) over gloo at each global batch, two repeats; its memory per device."""
    state, extra = (REPLICA, 0.0) if mode == "ddp" else (SHARD, 5.0)
    suffix = "" if mode == "ddp" else "-shardfull"
    shard = {} if mode == "ddp" else {"shard": "full"}
    return [
        make_record(
            samples_per_s=b / (t1(b / gpus) * 1.3) * wobble,
            mode=mode,
            gpus=gpus,
            backend="gloo",
            batch=b,
            probe=PROBE,
            memory=[(*state, ACT_MB * b / gpus + extra)] * gpus,
            repeat=k,
            suffix=f"{suffix}-r{k}",
            **shard,
            **keys,
        )
        for b in batches
        for k, wobble in enumerate((0.99, 1.01))
    ]


def table(recs: list[dict], budget_gib: float | None, plan: pd.DataFrame | None = None) -> pd.DataFrame:
    cells = cells_table([(f"results/cells/{r['cell']}/record.json", r) for r in recs], CURRENT["source_hash"])
    cells = utilisation.with_utilisation(cells, None)
    settings = utilisation.settings_with_utilisation(stats.settings_table(cells), cells)
    split = memory.split_table(memory.measured_rows([(None, r) for r in recs]), plan, cells)
    made = largest_batch.largest_batch_table(cells, settings, split, FITS, budget_gib)
    assert list(made.columns) == list(largest_batch.COLUMNS)
    return made


def row(made: pd.DataFrame, **keys) -> pd.Series:
    rows = made
    for key, value in keys.items():
        rows = rows[rows[key] == value]
    assert len(rows) == 1, keys
    return rows.iloc[0]


def b_star(capacity_mb: float, fixed_mb: float) -> int:
    """The law's b* on a CPU: the largest b with (fixed + ACT_MB b) x 1.1 <= capacity."""
    return math.floor((capacity_mb / 1.1 - fixed_mb) / ACT_MB + 1e-9)


def test_a_strategy_measured_at_two_batches_gets_its_own_line_and_b_star_within_or_beyond_them():
    inside = row(table(single(), 0.1), mode="single")  # 102.4 MB: b* 106, between 64 and 128
    assert inside["fixed_mb"] == pytest.approx(40.0) and inside["per_sample_mb"] == pytest.approx(ACT_MB)
    assert inside["memory_basis"] == "its own line through 2 measured and 0 planned per-device batch(es)"
    assert inside["capacity_mb"] == 0.1 * GIB and inside["capacity_source"] == "memory_budget_gib"
    assert inside["largest_batch"] == b_star(102.4, 40.0) == 106 and inside["how"] == "interpolated"
    assert inside["need_mb"] == pytest.approx((40.0 + ACT_MB * 106) * 1.1) and inside["need_mb"] <= 102.4
    assert inside["largest_global_batch"] == 106
    # not run at 106: one device's step-time line, with an interval
    assert inside["source"] == "forecast" and pd.isna(inside["setting"])
    assert inside["samples_per_s"] == pytest.approx(106 / t1(106), rel=0.01)
    assert inside["samples_per_s_low"] < inside["samples_per_s"] < inside["samples_per_s_high"]
    assert inside["basis"] == "2 single-device batch(es): the step-time line"
    beyond = row(table(single(), 1.0), mode="single")  # 1 GiB: far past 128
    assert beyond["largest_batch"] == b_star(1024, 40.0) and beyond["how"] == "extrapolated"
    assert "; batch 1781 outside the measured 64-128" in beyond["basis"]
    width = lambda r: math.log(r["samples_per_s_high"] / r["samples_per_s"])  # noqa: E731
    assert width(beyond) > width(inside)  # extrapolated: wider


def test_a_strategy_that_ran_at_its_largest_batch_is_measured_there():
    made = row(table(single(), 114.6 / GIB), mode="single")  # 128 needs 114.4 MB, 129 114.95
    assert made["largest_batch"] == 128 and made["source"] == "measured" and pd.isna(made["reason"])
    # the settings table's geometric mean of its two repeats, with their interval
    expected = math.exp((math.log(128 / t1(128) * 0.99) + math.log(128 / t1(128) * 1.01)) / 2)
    assert made["samples_per_s"] == pytest.approx(expected)
    assert made["samples_per_s_low"] < expected < made["samples_per_s_high"] and pd.notna(made["setting"])


def test_on_a_cpu_without_a_budget_nothing_bounds_the_batch():
    made = table([*single(), *multi("ddp")], None)
    assert made["largest_batch"].isna().all() and (made["source"] == "none").all()
    assert (made["reason"] == "no capacity: a CPU study without memory_budget_gib, so nothing bounds the batch").all()
    assert made["fixed_mb"].notna().all()  # the memory line is known all the same
    assert made["rank"].isna().all() and not made["fastest"].any()


def test_fsdp_fits_a_larger_batch_than_ddp_in_the_same_budget_its_state_sharded():
    made = table([*single(), *multi("ddp"), *multi("fsdp")], 0.2)  # 204.8 MB per device
    ddp, fsdp = row(made, mode="ddp"), row(made, mode="fsdp")
    # a replica holds one device's state and a gradient more (50 MB), a shard half of it and 5 MB of units
    assert ddp["fixed_mb"] == pytest.approx(50.0) and fsdp["fixed_mb"] == pytest.approx(25.0)
    assert ddp["largest_batch"] == b_star(204.8, 50.0) == 272
    assert fsdp["largest_batch"] == b_star(204.8, 25.0) == 322 > ddp["largest_batch"]
    assert ddp["largest_global_batch"] == 544 and ddp["how"] == "extrapolated"  # beyond 64-128 per device
    # neither ran there: both forecast by the step model at b* x 2, from their own kind
    assert ddp["source"] == fsdp["source"] == "forecast"
    assert "DDP setting(s) at n=2" in ddp["basis"] and "FSDP full setting(s) at n=2" in fsdp["basis"]
    # ranked by throughput at b*, one device (at its own b*) with them
    assert row(made, mode="single")["largest_batch"] == b_star(204.8, 40.0)
    placed = made.dropna(subset=["rank"]).sort_values("rank")
    assert list(placed["rank"]) == [1, 2, 3] and made["fastest"].sum() == 1
    assert placed.iloc[0]["samples_per_s"] >= placed.iloc[1]["samples_per_s"]
    assert placed["lead_claim"].notna().sum() == 1 and placed.iloc[0]["lead_claim"] in (0, 1)


def test_a_batch_skipped_by_the_budget_counts_by_the_plans_prediction():
    # DDP ran at 64 per device; at 512 per device the plan predicted 50 + 0.5 x 512 MB, over the budget
    skipped = make_record("skipped", mode="ddp", gpus=2, backend="gloo", batch=1024, reason=BUDGET_REASON)
    plan = pd.DataFrame(
        [{"cell": skipped["cell"], "device": d, "peak_mb": 50.0 + ACT_MB * 512, "reason": None} for d in (0, 1)]
    )
    made = table([*single(), *multi("ddp", batches=(128,)), skipped], 0.2, plan)
    ddp = row(made, mode="ddp")
    assert ddp["memory_basis"] == "its own line through 1 measured and 1 planned per-device batch(es)"
    assert ddp["fixed_mb"] == pytest.approx(50.0) and ddp["largest_batch"] == 272 and ddp["how"] == "interpolated"


def test_one_batch_of_its_own_takes_the_forecast_groups_memory_model():
    # DDP on 4 ran at one batch: the one-device line (40 + 0.5 b) plus DDP's extra over it (10 MB,
    # from DDP on 2), as calibration.py forecasts its memory
    made = table([*single(), *multi("ddp"), *multi("ddp", batches=(256,), gpus=4)], 0.2)
    four = row(made, mode="ddp", gpus=4)
    assert four["memory_basis"].startswith("the forecast group's memory model (memory from 2 single-device")
    assert four["fixed_mb"] == pytest.approx(50.0) and four["per_sample_mb"] == pytest.approx(ACT_MB)
    assert four["largest_batch"] == 272 and four["largest_global_batch"] == 4 * 272


def test_b_star_stays_below_a_batch_that_ran_out_of_memory():
    oom = make_record("oom", batch=100, reason=OOM_REASON)
    made = row(table([*single(), oom], 0.1), mode="single")
    assert made["largest_batch"] == 99 and "below per-device batch 100, which ran out of memory" in made["memory_basis"]


def test_a_strategy_that_cannot_fit_batch_one_says_so_and_no_cells_give_an_empty_table():
    made = row(table(single(), 0.01), mode="single")  # 10.24 MB < 40 MB of state
    assert pd.isna(made["largest_batch"]) and made["source"] == "none"
    assert made["reason"] == "does not fit at per-device batch 1 (needs 45 MB of 10)"
    empty = largest_batch.largest_batch_table(pd.DataFrame(), pd.DataFrame(), None, FITS, 1.0)
    assert list(empty.columns) == list(largest_batch.COLUMNS) and empty.empty


def test_a_text_workloads_tokens_per_s_is_its_samples_per_s_times_the_tokens_per_sample():
    recs = single()
    for rec in recs:
        rec["cost"] = {"task": "text", "tokens_per_sample": 128, "flops_per_sample": None}
    forecast, measured = row(table(recs, 0.1), mode="single"), row(table(recs, 114.6 / GIB), mode="single")
    for made in (forecast, measured):
        for part in ("", "_low", "_high"):
            assert made[f"tokens_per_s{part}"] == pytest.approx(128 * made[f"samples_per_s{part}"])
    assert (forecast["source"], measured["source"]) == ("forecast", "measured")
