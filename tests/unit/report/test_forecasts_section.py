"""The report's forecast section (dpstudy.report.findings.forecasts): it phrases the predictions table."""

from __future__ import annotations

import pandas as pd

from dpstudy.analysis import forecast
from dpstudy.report import findings


def predictions(rows: list[dict]) -> pd.DataFrame:
    common = {k: None for k in forecast.FORECAST_GROUP} | {"dataset": "synthetic", "model": "lenet"}
    common["source"] = "leave-one-out"
    return pd.DataFrame([{**common, **row} for row in rows], columns=list(forecast.COLUMNS))


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
    table = predictions(
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
    text = findings.forecasts({"predictions": table})
    assert (
        "- synthetic/lenet, DDP (gloo) on 2 devices at batch 64: forecast 9,000 samples/s (95 % 8,000-9,900), "
        "measured 10,000: error -10.0 %; extrapolated: per-device batch 32 outside the measured 64-256." in text
    )
    assert "at batch 256: forecast 20,600 samples/s (95 % 18,000-23,000), measured 20,000: error +3.0 %." in text
    # the median of 10 % and 3 %, the largest, and one of two inside its interval (10,000 is not)
    assert "Over 2 held-out setting(s): median |error| 6.5 %, largest 10.0 %; 1 of 2 measured inside" in text


def test_a_study_without_two_ddp_settings_says_why_there_is_no_forecast():
    text = findings.forecasts({"predictions": predictions([])})
    assert text.startswith("*Not measured in this study:* a forecast is checked on two or more DDP settings")


def test_forecasts_the_study_asked_for_follow_with_their_basis_or_why_not():
    asked = {"source": "predict", "mode": "ddp", "devices": 8, "global_batch": 256}
    table = predictions(
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
    text = findings.forecasts({"predictions": table})
    assert "Over 1 held-out setting(s): median |error| 3.0 %" in text
    assert (
        "- synthetic/lenet, DDP (gloo) on 8 devices at batch 256: 30,000 samples/s (95 % 20,000-45,000), "
        "3.14x one device; extrapolated: 8 ranks extrapolated from 2." in text
    )
    assert (
        "DDP (nccl) on 8 devices at batch 256: not forecast: no measured DDP setting over nccl calibrates it." in text
    )
