"""Item 9 of `make gpu-check`: on a host with MIN_GPUS or more GPUs, forecasts beyond two GPUs made
from one device and two, checked against cells that ran there.

A study (study(visible)): resnet18 on synthetic_rgb, one device at every per-device batch the
multi-GPU cells use, DDP and FSDP (full) over NCCL at GLOBAL_BATCH on 2, 4, ... GPUs (powers of two
up to those visible, and all of them), two repeats, and the comm sweep (NCCL, 2 ranks). The model is
calibrated as the analysis calibrates it (dpstudy.analysis.calibration.Calibration) on the single-device
settings and the settings on at most CALIBRATE_GPUS GPUs alone; every setting on more GPUs is
forecast (the host share and the ring collectives extrapolated from 2 ranks, as for a `forecast:`
request of 4 or 8) and compared with what it measured: each error, their median and largest, and
how many measured throughputs fell inside their 95 % intervals.

On fewer GPUs the item is not applicable and says so (a one-GPU host checks the batch and memory
forecasts, item 8). `evaluate(tables)` is pure, tested without a GPU.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from dpstudy.analysis.calibration import Calibration, calibration_inputs, group_of, interval
from dpstudy.analysis.forecast_table import model_sigma
from dpstudy.analysis.keys import FORECAST_GROUP
from dpstudy.gpucheck.study import run_in_copy

MIN_GPUS = 3
CALIBRATE_GPUS = 2
MODEL = "resnet18"
GLOBAL_BATCH = 1024
TABLES = ("settings", "cells", "comm_fit")


def device_counts(visible: int) -> list[int]:
    """The multi-GPU counts the study runs: powers of two from 2 up to `visible`, and `visible`."""
    counts, n = [], 2
    while n <= visible:
        counts.append(n)
        n *= 2
    return sorted({*counts, visible}) if visible >= 2 else []


def study(visible: int) -> dict:
    """The item's study on a host with `visible` GPUs."""
    counts = device_counts(visible)
    per_device = sorted({GLOBAL_BATCH // n for n in (1, *counts)})
    multi = {"gpus": counts, "batch": [GLOBAL_BATCH], "backend": ["nccl"]}
    return {
        "study": "gpucheck_scaling",
        "device": "cuda",
        "datasets": {"synthetic_rgb": {"train_size": 16 * GLOBAL_BATCH, "test_size": 1024}},
        "defaults": {
            "epochs": 3,
            "repeats": 2,
            "loader": "device",
            "optimizer": "adam",
            "lr": 0.001,
            "batch_scope": "global",
        },
        "bench": {"kernels": False, "comm": True},
        "sweeps": [
            {
                "name": "one",
                "dataset": "synthetic_rgb",
                "model": MODEL,
                "grid": {"mode": ["single"], "batch": per_device},
            },
            {"name": "ddp", "dataset": "synthetic_rgb", "model": MODEL, "grid": {"mode": ["ddp"], **multi}},
            {
                "name": "fsdp",
                "dataset": "synthetic_rgb",
                "model": MODEL,
                "grid": {"mode": ["fsdp"], "shard": ["full"], **multi},
            },
        ],
    }


def held_out_forecasts(single: pd.DataFrame, multi: pd.DataFrame, fits: pd.DataFrame) -> pd.DataFrame:
    """Per setting on more than CALIBRATE_GPUS GPUs: its forecast from the forecast group's
    single-device settings and its settings on at most CALIBRATE_GPUS (its own and every larger count
    never read), with the 95 % interval and the error against what it measured."""
    rows = []
    for key, own in multi.groupby(list(FORECAST_GROUP), dropna=False, sort=True):
        singles = group_of(single, key)
        calibrating, held = own[own["devices"] <= CALIBRATE_GPUS], own[own["devices"] > CALIBRATE_GPUS]
        if singles.empty or calibrating.empty:
            continue
        model = Calibration(singles, calibrating, fits)
        sigma = model_sigma(pd.Series(dtype=float), pd.concat([singles["noise_cv"], calibrating["noise_cv"]]))
        for _, row in held.iterrows():
            try:
                made = model.forecast(
                    row["scheme"], row["backend"], row["env_device"], int(row["devices"]), int(row["global_batch"])
                )
            except LookupError as error:
                rows.append({"scheme": row["scheme"], "devices": int(row["devices"]), "reason": str(error)})
                continue
            low, high = interval(made["predicted_samples_per_s"], sigma, made["distance"])
            measured = row["samples_per_s"]
            rows.append(
                {
                    "model": row["model"],
                    "scheme": row["scheme"],
                    "devices": int(row["devices"]),
                    "global_batch": int(row["global_batch"]),
                    "predicted_samples_per_s": made["predicted_samples_per_s"],
                    "predicted_low": low,
                    "predicted_high": high,
                    "measured_samples_per_s": measured,
                    "error": made["predicted_samples_per_s"] / measured - 1,
                    "inside": bool(low <= measured <= high),
                    "how": made["how"],
                    "basis": made["basis"],
                    "noise_cv": row["noise_cv"],
                    "reason": None,
                }
            )
    return pd.DataFrame(rows)


def evaluate(tables: dict[str, pd.DataFrame]) -> dict:
    """Figures, details and notes from the study's tables (settings, cells, comm_fit). Pure."""
    single, multi = calibration_inputs(tables["settings"], tables["cells"])
    fits = tables.get("comm_fit", pd.DataFrame())
    made = held_out_forecasts(single, multi, fits)
    figures, details, notes = {}, {}, []
    checked = made.dropna(subset=["error"]) if "error" in made else made
    counts = sorted(int(n) for n in multi["devices"].unique())
    if len(checked):
        errors = checked["error"].abs()
        figures.update(
            scaling_median_error=float(errors.median()),
            scaling_max_error=float(errors.max()),
            scaling_inside=float(checked["inside"].mean()),
            scaling_checked=len(checked),
        )
        details["scaling_median_error"] = (
            f"{len(checked)} settings on {', '.join(str(n) for n in counts if n > CALIBRATE_GPUS)} GPUs, "
            f"calibrated on 1 and {CALIBRATE_GPUS}"
        )
        notes += [
            f"{r.scheme} on {r.devices} GPUs at {r.global_batch}: forecast {r.predicted_samples_per_s:,.0f} "
            f"[{r.predicted_low:,.0f}-{r.predicted_high:,.0f}] vs measured {r.measured_samples_per_s:,.0f} "
            f"samples/s ({r.error:+.1%}; {r.how}: {r.basis})"
            for r in checked.itertuples()
        ]
    else:
        figures["scaling_checked"] = 0
        details["scaling_median_error"] = f"no setting on more than {CALIBRATE_GPUS} GPUs ran (GPU counts: {counts})"
    if "reason" in made:
        notes += [f"{r.scheme} on {r.devices} GPUs not forecast: {r.reason}" for r in made.itertuples() if r.reason]
    return {"figures": figures, "details": details, "notes": notes, "data": {"forecasts": made.to_dict("records")}}


def run_scaling(out: Path) -> dict:
    """The study through Snakemake in a copy of the checkout, then evaluate; not applicable on fewer
    than MIN_GPUS GPUs."""
    import torch

    visible = torch.cuda.device_count()
    if visible < MIN_GPUS:
        return {
            "not_applicable": f"needs {MIN_GPUS} or more GPUs (calibrates on 1-{CALIBRATE_GPUS}); {visible} visible"
        }
    config = study(visible)
    made = run_in_copy(out, "scaling", config, TABLES, gpus=visible)
    missing = [name for name in TABLES if name not in made["tables"]]
    if missing:
        raise RuntimeError(
            f"Snakemake ended (exit status {made['returncode']}) without {', '.join(missing)}; see above"
        )
    result = evaluate(made["tables"])
    result["figures"]["wall_s"] = made["wall_s"]
    return {**result, "files": made["files"], "params": {"command": made["command"][1:], "study": config}}
