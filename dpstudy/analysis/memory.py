"""Memory per device: the split each record measured (dpstudy.engine.memory) beside the memory
plan's prediction (dpstudy.jobs.memory_plan), and how close the prediction came.

memory_split: one row per cell and device (DP: each GPU; ddp, fsdp: each rank) of every cell the
  records or the plan know: the measured parts and peak (ok cells), the predicted ones (every
  cell the plan predicted, skipped ones too), error_pct = (predicted - measured) / measured.
memory_accuracy: per mode and for all modes together ("all"), over the devices with both
  numbers: how many, the median and the largest |error_pct|, and whether every one is within
  the target (the issue's 15 %).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from dpstudy.record.fields import MEMORY_PARTS

TARGET_PCT = 15.0  # the prediction's target: within 15 % of the measured peak
PREDICTED = tuple(f"predicted_{part}" for part in MEMORY_PARTS)
SPLIT_COLUMNS = ("cell", "mode", "device", *MEMORY_PARTS, *PREDICTED, "error_pct", "plan_reason")
ACCURACY_COLUMNS = ("mode", "devices", "median_abs_error_pct", "max_abs_error_pct", "target_pct", "within_target")


def measured_rows(records: list[tuple[str, dict[str, Any]]]) -> pd.DataFrame:
    """Each record's memory split, one row per device (records without one give none)."""
    rows = [
        {"cell": rec["cell"], "device": device, **{part: rec["memory"][part][device] for part in MEMORY_PARTS}}
        for _, rec in records
        if rec.get("memory")
        for device in range(len(rec["memory"]["peak_mb"]))
    ]
    return pd.DataFrame(rows, columns=["cell", "device", *MEMORY_PARTS])


def split_table(measured: pd.DataFrame, plan: pd.DataFrame | None, cells: pd.DataFrame) -> pd.DataFrame:
    """memory_split (see the module docstring) for the cells of the cells table."""
    known = cells[["cell", "mode"]]
    if plan is None or plan.empty:
        plan = pd.DataFrame(columns=["cell", "device", *MEMORY_PARTS, "reason"])
    predicted = plan.rename(columns={**dict(zip(MEMORY_PARTS, PREDICTED)), "reason": "plan_reason"})
    predicted = predicted[predicted["cell"].isin(known["cell"])]
    reasons = predicted[predicted["device"].isna()][["cell", "plan_reason"]]
    predicted = predicted.dropna(subset=["device"]).drop(columns="plan_reason").astype({"device": int})
    table = measured.astype({"device": int}).merge(predicted, on=["cell", "device"], how="outer")
    table = table.merge(reasons, on="cell", how="outer").merge(known, on="cell", how="left")
    table = table.assign(error_pct=(table["predicted_peak_mb"] - table["peak_mb"]) / table["peak_mb"] * 100)
    table = table.reindex(columns=list(SPLIT_COLUMNS))
    return table.astype({"device": "Int64"}).sort_values(["cell", "device"], ignore_index=True)


def accuracy_table(split: pd.DataFrame) -> pd.DataFrame:
    """memory_accuracy (see the module docstring); empty when no device has both numbers."""
    both = split.dropna(subset=["error_pct"])
    groups = [(mode, part) for mode, part in both.groupby("mode")] + ([("all", both)] if not both.empty else [])
    rows = [
        {
            "mode": mode,
            "devices": len(part),
            "median_abs_error_pct": part["error_pct"].abs().median(),
            "max_abs_error_pct": part["error_pct"].abs().max(),
            "target_pct": TARGET_PCT,
            "within_target": bool((part["error_pct"].abs() <= TARGET_PCT).all()),
        }
        for mode, part in groups
    ]
    return pd.DataFrame(rows, columns=list(ACCURACY_COLUMNS))
