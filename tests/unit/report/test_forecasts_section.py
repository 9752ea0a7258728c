"""The report's forecast section (dpstudy.report.findings.forecasts), which phrases the forecasts
table, and its figure (forecasts.png), which draws it beside the measured settings."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from helpers.plots import errorbars, repeated, tables_of
from helpers.records import make_record

from dpstudy.analysis import keys
from dpstudy.analysis.forecast_table import COLUMNS
from dpstudy.report import figures as plots
from dpstudy.report import findings


def forecasts_table(rows: list[dict]) -> pd.DataFrame:
    common = {k: None for k in keys.FORECAST_GROUP} | {"dataset": "synthetic", "model": "lenet"}
    common["source"] = "leave-one-out"
    return pd.DataFrame([{**common, **row} for row in rows], columns=list(COLUMNS))


# DDP on 2 ranks at batch 256 forecast from the other settings: 3 % over what it measured
HELD_OUT_256 = {
    "mode": "ddp",
    "backend": "gloo",
    "devices": 2,
    "global_batch": 256,
    "predicted_samples_per_s": 20600.0,
    "predicted_low": 18000.0,
    "predicted_high": 23000.0,
    "predicted_speedup": 1.1,
    "how": "interpolated",
    "basis": "2 single-device batch(es); 1 DDP setting(s) at n=2",
    "measured_samples_per_s": 20000.0,
    "error": 0.03,
}


def test_each_held_out_setting_is_a_line_and_the_error_is_summed_up():
    table = forecasts_table(
        [
            {
                "mode": "ddp",
                "backend": "gloo",
                "devices": 2,
                "global_batch": 64,
                "predicted_samples_per_s": 9000.0,
                "predicted_low": 8000.0,
                "predicted_high": 9900.0,
                "predicted_speedup": 0.9,
                "how": "extrapolated",
                "basis": "2 single-device batch(es); 1 DDP setting(s) at n=2; "
                "per-device batch 32 outside the measured 64-256",
                "measured_samples_per_s": 10000.0,
                "error": -0.1,
            },
            HELD_OUT_256,
        ]
    )
    text = findings.forecasts({"forecasts": table})
    assert (
        "- synthetic/lenet, DDP (gloo) on 2 devices at batch 64: forecast 9,000 samples/s (95 % 8,000-9,900), "
        "measured 10,000: error -10.0 %; extrapolated: per-device batch 32 outside the measured 64-256." in text
    )
    assert "at batch 256: forecast 20,600 samples/s (95 % 18,000-23,000), measured 20,000: error +3.0 %." in text
    # the median of 10 % and 3 %, the largest, and one of two inside its interval (10,000 is not)
    assert "Over 2 held-out setting(s): median |error| 6.5 %, largest 10.0 %; 1 of 2 measured inside" in text


def test_a_study_without_two_ddp_settings_says_why_there_is_no_forecast():
    text = findings.forecasts({"forecasts": forecasts_table([])})
    assert text.startswith("*Not measured in this study:* a forecast is checked on two or more DDP settings")


def test_forecasts_the_study_asked_for_follow_with_their_basis_or_why_not():
    asked = {"source": "requested", "mode": "ddp", "devices": 8, "global_batch": 256}
    table = forecasts_table(
        [
            HELD_OUT_256,
            {
                **asked,
                "backend": "gloo",
                "predicted_samples_per_s": 30000.0,
                "predicted_low": 20000.0,
                "predicted_high": 45000.0,
                "predicted_speedup": 3.14159,
                "how": "extrapolated",
                "basis": "2 single-device batch(es); 2 DDP setting(s) at n=2; 8 ranks extrapolated from 2",
            },
            {
                **asked,
                "backend": "nccl",
                "how": "not forecast",
                "basis": "no measured DDP setting over nccl calibrates it",
            },
        ]
    )
    text = findings.forecasts({"forecasts": table})
    assert "Over 1 held-out setting(s): median |error| 3.0 %" in text
    assert (
        "- synthetic/lenet, DDP (gloo) on 8 devices at batch 256: 30,000 samples/s (95 % 20,000-45,000), "
        "3.14x one device; extrapolated: 8 ranks extrapolated from 2." in text
    )
    assert (
        "DDP (nccl) on 8 devices at batch 256: not forecast: no measured DDP setting over nccl calibrates it." in text
    )


@pytest.fixture
def forecast_tables(tmp_path) -> dict[str, pd.DataFrame]:
    """Single and DDP/gloo over 2 ranks at batch 256 (three repeats each), the DDP setting also held
    out (HELD_OUT_256), and forecasts at 4 ranks (interpolated, for the test) and 8 (extrapolated)."""
    tables = tables_of(
        tmp_path,
        [
            *repeated([1000.0, 1040.0, 960.0], mode="single", batch=256, memory=[(1.0, 1.0, 2.0, 25.6)]),
            *repeated(
                [1500.0, 1620.0, 1410.0], mode="ddp", gpus=2, backend="gloo", batch=256, memory=[(1, 2, 2, 12.8)] * 2
            ),
        ],
    )
    ahead = {"source": "requested", "mode": "ddp", "backend": "gloo", "global_batch": 256}
    tables["forecasts"] = forecasts_table(
        [
            HELD_OUT_256,
            {**ahead, "devices": 4, "predicted_memory_mb": 11.4, "predicted_memory_low": 10.0,
             "predicted_memory_high": 13.0, "predicted_samples_per_s": 2000.0, "predicted_low": 1600.0,
             "predicted_high": 2500.0, "predicted_speedup": 2.0, "how": "interpolated", "basis": "b"},
            {**ahead, "devices": 8, "predicted_samples_per_s": 2400.0, "predicted_low": 1200.0,
             "predicted_high": 4800.0, "predicted_speedup": 2.4, "how": "extrapolated", "basis": "b; c; 8 ranks"},
            {**ahead, "devices": 16, "how": "not forecast", "basis": "no all_reduce fit"},
        ]
    )  # fmt: skip
    return tables


def test_each_point_is_drawn_with_its_own_interval(forecast_tables):
    fig = plots.FIGURES["forecasts.png"](forecast_tables)
    ax, memory_ax = fig.axes  # speedup above, memory per device below
    measured = forecast_tables["settings"].query("devices == 2").iloc[0]
    assert measured["speedup_low"] < measured["speedup"] < measured["speedup_high"]
    points = [p for points, _ in errorbars(ax) for p in points]
    assert (2, pytest.approx(measured["speedup"])) in points
    # the held-out forecast of the measured setting, beside it: its speedup 1.1, its interval scaled alike
    assert (pytest.approx(2 * 1.06), pytest.approx(1.1)) in points
    # forecasts: the speedup and the prediction interval's ratios to the throughput (4 ranks: 1.6-2.5)
    bars_at_4 = next(bars for points, bars in errorbars(ax) if points and points[0][0] == 4)
    assert bars_at_4[0] == [[4, pytest.approx(1.6)], [4, pytest.approx(2.5)]]
    bars_at_8 = next(bars for points, bars in errorbars(ax) if points and points[0][0] == 8)
    assert bars_at_8[0] == [[8, pytest.approx(1.2)], [8, pytest.approx(4.8)]]
    # a request that was not forecast is not a point; the title gives the held-out error
    assert 16 not in {p[0] for p in points}
    assert "leave-one-out median |error|: throughput 3.0 %" in ax.get_title()
    # an extrapolated forecast's bar is dotted, an interpolated one's solid
    dashes = {c.lines[0].get_xdata()[0]: c.lines[2][0].get_linestyle()[0][1] for c in ax.containers}
    assert dashes[8] is not None and dashes[4] is None
    # memory per device: one device's 29.6 MB at batch 256, two ranks' 17.8 each, 4 ranks' forecast
    memory_points = [p for points, _ in errorbars(memory_ax) for p in points]
    for point in ((1, 29.6), (2, 17.8), (4, 11.4)):
        assert pytest.approx(point) in memory_points
    plt.close(fig)


def test_a_study_without_forecasts_says_so(tmp_path):
    tables = tables_of(tmp_path, [make_record(mode="single")])
    tables["forecasts"] = forecasts_table([])
    fig = plots.FIGURES["forecasts.png"](tables)
    assert "No forecast" in "\n".join(t.get_text() for t in fig.findobj(plt.Text))
    plt.close(fig)


def test_memory_per_device_is_told_beside_the_throughput_where_it_was_forecast():
    memory = {"predicted_memory_mb": 41.0, "predicted_memory_low": 38.0, "predicted_memory_high": 44.0}
    held = {**HELD_OUT_256, **memory, "measured_memory_mb": 40.0, "memory_error": 0.025}
    asked = {**HELD_OUT_256, **memory, "source": "requested", "devices": 8, "how": "interpolated"}
    text = findings.forecasts({"forecasts": forecasts_table([held, asked])})
    assert (
        "measured 20,000: error +3.0 %; memory 41.0 MB per device (95 % 38.0-44.0), measured 40.0: error +2.5 %."
        in text
    )
    assert "1.10x one device; memory 41.0 MB per device (95 % 38.0-44.0)." in text


def test_each_forecast_says_whether_it_fits_and_from_which_count():
    asked = {**HELD_OUT_256, "source": "requested", "how": "interpolated", "capacity_mb": 80 * 1024}
    rows = [
        {**asked, "devices": n, "predicted_memory_mb": mb, "need_mb": mb * 1.1 + 760, "fits": mb * 1.1 + 760 <= 81920}
        for n, mb in ((2, 90_000.0), (4, 60_000.0), (8, 30_000.0))
    ]
    text = findings.forecasts({"forecasts": forecasts_table([HELD_OUT_256, *rows])})
    assert "; does **not** fit 80 GiB (needs 97.4)." in text  # 90,000 MB + 10 % + 760 MB
    assert "; fits 80 GiB (needs 65.2)." in text
    assert "synthetic/lenet, DDP (gloo) at batch 256 fits at 4, 8 of 2, 4, 8 devices." in text
    unknown = [{**row, "fits": None, "capacity_mb": None} for row in rows]  # a CPU study without a budget
    text = findings.forecasts({"forecasts": forecasts_table([HELD_OUT_256, *unknown])})
    assert "fit" not in text.split("Forecasts of settings not run")[1]


def test_the_memory_axis_shows_up_to_where_a_forecast_fits(forecast_tables):
    # a device of 40 MB and a context of 2 MB: a forecast fits below (40 - 2) / 1.1 = 34.5 MB
    table = forecast_tables["forecasts"]
    forecast_tables["forecasts"] = table.assign(
        capacity_mb=40.0, need_mb=table["predicted_memory_mb"] * 1.1 + 2.0, fits=table["predicted_memory_mb"] < 34.5
    )
    fig = plots.FIGURES["forecasts.png"](forecast_tables)
    memory_ax = fig.axes[1]
    (limit,) = [line.get_ydata()[0] for line in memory_ax.lines if line.get_linestyle() == "-."]
    assert limit == pytest.approx(38 / 1.1)
    assert any("fits below 34.5 MB (0.0391 GiB per device)" in t.get_text() for t in memory_ax.texts)
    plt.close(fig)
    # an 80 GB device: far above every point, said in words, not drawn
    forecast_tables["forecasts"] = forecast_tables["forecasts"].assign(capacity_mb=81_920.0)
    fig = plots.FIGURES["forecasts.png"](forecast_tables)
    memory_ax = fig.axes[1]
    assert not [line for line in memory_ax.lines if line.get_linestyle() == "-."]
    assert any(t.get_text().endswith("(80 GiB per device): every point fits") for t in memory_ax.texts)
    plt.close(fig)


def test_a_language_model_s_forecast_is_also_told_in_tokens_per_s():
    asked = {**HELD_OUT_256, "source": "requested", "devices": 8, "model": "gpt", "dataset": "synthetic_text"}
    tokens = {"predicted_tokens_per_s": 20600.0 * 64, "predicted_tokens_low": 18000.0 * 64}
    table = forecasts_table([asked]).assign(**tokens, predicted_tokens_high=23000.0 * 64)
    text = findings.forecasts({"forecasts": table})
    assert "20,600 samples/s (95 % 18,000-23,000), 1,320,000 tokens/s (95 % 1,150,000-1,470,000), 1.10x" in text, text
