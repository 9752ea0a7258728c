"""The `forecasts` table: every measured DDP setting forecast from the others (leave-one-out, the
model's error on this study), then the forecasts the study's `forecast:` block asks for
(dpstudy.study.forecast_requests), each by dpstudy.analysis.calibration's model of its forecast group.

Per row: throughput and speedup over one device, memory per device (the fullest device's step
peak: on CUDA the allocator's, max_memory_allocated; elsewhere PyTorch's tracker's), each forecast
with a 95 % interval; how it was reached (`how`, `basis`); for a held-out setting what it
measured and the errors (predicted / measured - 1). The intervals' sigma is the RMS of the
held-out log errors, never below the settings' own noise for
throughput: a model cannot be checked to better than its inputs scatter.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dpstudy.analysis import capacity
from dpstudy.analysis.baseline import baseline_key
from dpstudy.analysis.calibration import Calibration, calibration_inputs, group_of, interval
from dpstudy.analysis.keys import FORECAST_GROUP
from dpstudy.study import modes

COLUMNS = (
    *FORECAST_GROUP,
    "mode",
    "shard",
    "backend",
    "devices",
    "global_batch",
    "predicted_samples_per_s",
    "predicted_low",
    "predicted_high",
    "predicted_speedup",
    "predicted_memory_mb",
    "predicted_memory_low",
    "predicted_memory_high",
    "how",
    "basis",
    "source",
    "measured_samples_per_s",
    "error",
    "measured_memory_mb",
    "memory_error",
    # will it fit (dpstudy.analysis.capacity)
    "need_mb",
    "capacity_mb",
    "fits",
)


def leave_one_out(
    settings: pd.DataFrame,
    cells: pd.DataFrame,
    fits: pd.DataFrame,
    split: pd.DataFrame | None = None,
    epochs: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The table's measured rows: every DDP and FSDP setting over 2+ ranks forecast from the
    forecast group's other settings (its own never read), beside what it measured (and `noise_cv`, its
    own, which the interval cannot beat). A setting no other calibrates is left out."""
    return held_out_rows(*calibration_inputs(settings, cells, split, epochs), fits)


def held_out_rows(single: pd.DataFrame, multi: pd.DataFrame, fits: pd.DataFrame) -> pd.DataFrame:
    """leave_one_out's rows from calibration_inputs' two frames."""
    rows = []
    for key, own in multi.groupby(list(FORECAST_GROUP), dropna=False, sort=True):
        singles = group_of(single, key)
        if singles.empty:
            continue
        for index, held_out in own.iterrows():
            try:
                model = Calibration(singles, own.drop(index), fits)
                made = model.forecast(
                    held_out["scheme"],
                    held_out["backend"],
                    held_out["env_device"],
                    int(held_out["devices"]),
                    int(held_out["global_batch"]),
                )
            except LookupError:
                continue
            rows.append(
                {
                    **dict(zip(FORECAST_GROUP, key, strict=True)),
                    **{k: held_out.get(k) for k in ("mode", "shard", "backend", "devices", "global_batch")},
                    **made,
                    "source": "leave-one-out",
                    "measured_samples_per_s": held_out["samples_per_s"],
                    "error": made["predicted_samples_per_s"] / held_out["samples_per_s"] - 1,
                    "measured_memory_mb": held_out["held_mb"],
                    "memory_error": made["predicted_memory_mb"] / held_out["held_mb"] - 1,
                    "noise_cv": held_out["noise_cv"],
                }
            )
    table = pd.DataFrame(rows)
    if table.empty:
        return pd.DataFrame(columns=[*COLUMNS, "noise_cv"])
    with_intervals(table, *sigmas(table))
    return table.reindex(columns=[*COLUMNS, "noise_cv"])


def model_sigma(errors: pd.Series, noise_cv: pd.Series | None = None) -> float:
    """The log-scale spread of a forecast: the RMS of the held-out log errors, never below the
    settings' own median noise where given; NaN with no error to go by."""
    logs = np.log1p(errors.dropna().astype(float))
    rms = float(np.sqrt(np.mean(logs**2))) if len(logs) else math.nan
    noise = float(np.nanmedian(noise_cv)) if noise_cv is not None and noise_cv.notna().any() else math.nan
    return math.nan if math.isnan(rms) and math.isnan(noise) else float(np.nanmax([rms, noise]))


def sigmas(held_out: pd.DataFrame) -> tuple[float, float]:
    """(throughput's sigma, memory's sigma) from the held-out rows."""
    return model_sigma(held_out["error"], held_out["noise_cv"]), model_sigma(held_out["memory_error"])


def with_intervals(table: pd.DataFrame, sigma: float, memory_sigma: float) -> None:
    """Each row's 95 % intervals of throughput and memory, in place (NaN where the sigma is)."""
    for value, sig, low, high in (
        ("predicted_samples_per_s", sigma, "predicted_low", "predicted_high"),
        ("predicted_memory_mb", memory_sigma, "predicted_memory_low", "predicted_memory_high"),
    ):
        bounds = [interval(p, sig, d) for p, d in zip(table[value], table["distance"], strict=True)]
        table[low], table[high] = zip(*bounds, strict=True) if bounds else ([], [])


def requested(
    single: pd.DataFrame,
    multi: pd.DataFrame,
    fits: pd.DataFrame,
    requests: list[dict],
    sigma: tuple[float, float],
) -> pd.DataFrame:
    """The table's forecast rows: every request (dpstudy.study.forecast_requests.requests) for every forecast
    group with measured DDP or FSDP settings its filters match, calibrated on all of them (`single`,
    `multi`: calibration_inputs'); a request the group cannot answer (no setting over its
    backend, no collective's fit) is a row with the reason as its basis and no numbers. `sigma`:
    sigmas() of the held-out rows."""
    rows = []
    for key, own in multi.groupby(list(FORECAST_GROUP), dropna=False, sort=True) if requests else []:
        group = dict(zip(FORECAST_GROUP, key, strict=True))
        singles = group_of(single, key)
        if singles.empty:
            continue
        try:  # no all-reduce fit (bench comm: false): every request of the group says so
            model, unfit = Calibration(singles, own, fits), None
        except LookupError as error:
            model, unfit = None, str(error)
        for request in requests:
            if any(request[k] is not None and group[k] not in request[k] for k in ("dataset", "model")):
                continue
            row = {**group, **{k: request.get(k) for k in ("mode", "shard", "backend")}, "source": "requested"}
            row.update(devices=request["gpus"], global_batch=request["batch"])
            try:  # no DDP setting over the request's backend: say so
                if model is None:
                    raise LookupError(unfit)
                made = model.forecast(
                    modes.scheme_name(request["mode"], request.get("shard")),
                    request["backend"],
                    group["env_device"],
                    request["gpus"],
                    request["batch"],
                )
            except LookupError as error:
                rows.append({**row, "how": "not forecast", "basis": str(error)})
                continue
            rows.append({**row, **made})
    table = pd.DataFrame(rows, columns=[*COLUMNS, "distance"])
    forecast_rows = table["how"] != "not forecast"
    if forecast_rows.any():
        made = table[forecast_rows].copy()
        with_intervals(made, *sigma)
        table.loc[forecast_rows, made.columns] = made
    return table.reindex(columns=list(COLUMNS))


def forecasts(
    settings: pd.DataFrame,
    cells: pd.DataFrame,
    fits: pd.DataFrame,
    requests: list[dict],
    split: pd.DataFrame | None = None,
    budget_gib: float | None = None,
    epochs: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The `forecasts` table: leave_one_out's rows, then the requested forecasts, each with
    whether it fits (dpstudy.analysis.capacity; `budget_gib`: the study's memory_budget_gib;
    `epochs`: the epochs table, whose data wait the model separates)."""
    single, multi = calibration_inputs(settings, cells, split, epochs)
    held_out = held_out_rows(single, multi, fits)
    if held_out.empty:  # nothing held out to check the model on: the settings' own noise alone
        sigma = (model_sigma(pd.Series(dtype=float), settings.get("noise_cv")), math.nan)
    else:
        sigma = sigmas(held_out)
    forecasts = requested(single, multi, fits, requests, sigma)
    frames = [frame for frame in (held_out[list(COLUMNS)], forecasts) if not frame.empty]
    table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(COLUMNS))
    return capacity.with_fit(table, split, budget_gib)[list(COLUMNS)]


def held_out_by_setting(forecasts: pd.DataFrame, settings: pd.DataFrame) -> pd.Series:
    """The leave-one-out forecast's throughput of every setting that has one, by its number in the
    settings table (what the strategies table ranks by: the model that never read the setting)."""
    held = forecasts[forecasts["source"] == "leave-one-out"] if "source" in forecasts else forecasts.iloc[0:0]
    if held.empty or settings.empty:
        return pd.Series(dtype=float)
    keys = [*FORECAST_GROUP, "mode", "shard", "backend", "devices", "global_batch"]
    keys = [k for k in keys if k in settings and k in held]
    # keys as baseline.baseline_key makes them: a missing value matches a missing one, 64 matches 64.0
    made = {baseline_key(r[k] for k in keys): r["predicted_samples_per_s"] for r in held.to_dict("records")}
    found = {
        int(row["setting"]): float(made[key])
        for row in settings.to_dict("records")
        if (key := baseline_key(row[k] for k in keys)) in made
    }
    return pd.Series(found, dtype=float)
