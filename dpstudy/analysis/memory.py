"""Memory per device: the split each record measured (dpstudy.engine.memory) beside the memory
plan's prediction (dpstudy.workflow.memory_plan), and how close the prediction came.

memory_split: one row per cell and device (DP: each GPU; ddp, fsdp: each rank) of every cell the
  records or the plan know: the measured parts and peak (ok cells), on CUDA what the allocator
  and the driver held (record.fields.ALLOCATOR_PARTS), the predicted parts (every cell the plan
  predicted, skipped ones too), the plan's allocator peak (predicted_allocated_mb) and what the
  libraries' workspaces add to it (predicted_workspace_mb, where the plan ran beside a GPU), and
  error_pct = (predicted - measured) / measured: against max_memory_allocated where the cell ran
  on CUDA (`against` allocator), else the tracker's prediction against the tracker's own
  measurement (`against` tracker: on a CPU there is no allocator peak to check it with).
memory_accuracy: per kind of comparison (`against`) and mode, and for all modes together
  ("all"), over the devices with both numbers: how many, the median and the largest |error_pct|,
  and whether every one is within the target (the issue's 15 %); beside them the medians of the
  step's activations (tracker) and, on a CPU, of how much the process's resident memory grew over
  the step (rss_growth_mb: what the tracker cannot see there, the C allocator's caching included).
memory_spread: how a strategy spreads a step's memory over its devices, per mode, sharding and
  device count over the finished multi-device cells with a measured split: the fullest device's
  peak over the emptiest's (`imbalance`: DP's device 0 holds the batch and the optimizer) and the
  fullest device's model state (parameters + gradients + optimizer state) over the one-device
  baseline's (`state_share`: 1 for a replica, about 1/n for FSDP's shards), medians over the cells;
  `example` is the cell at the median share, `state_mb` and `baseline_state_mb` its own MB.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from dpstudy.analysis.baseline import Baselines
from dpstudy.record.fields import ALLOCATOR_PARTS, HOST_PARTS, MEMORY_PARTS

TARGET_PCT = 15.0  # the prediction's target: within 15 % of the measured peak
PLANNED = (*MEMORY_PARTS, "allocated_mb", "workspace_mb")  # the plan's columns a row predicts
PREDICTED = tuple(f"predicted_{part}" for part in PLANNED)
SPLIT_COLUMNS = (
    "cell",
    "mode",
    "device",
    *MEMORY_PARTS,
    *ALLOCATOR_PARTS,
    *HOST_PARTS,
    *PREDICTED,
    "against",
    "error_pct",
    "plan_reason",
)
STATE_PARTS = ("params_mb", "grads_mb", "optimizer_mb")
SPREAD_COLUMNS = (
    "mode",
    "shard",
    "devices",
    "cells",
    "imbalance",
    "state_share",
    "state_mb",
    "baseline_state_mb",
    "example",
)
ACCURACY_COLUMNS = (
    "against",
    "mode",
    "devices",
    "median_abs_error_pct",
    "max_abs_error_pct",
    "target_pct",
    "within_target",
    # beside a comparison against the tracker (CPU): the step's activations by the tracker and how
    # much the process's resident memory grew over the same step (medians over the devices)
    "activations_mb",
    "rss_growth_mb",
)


def measured_rows(records: list[tuple[str, dict[str, Any]]]) -> pd.DataFrame:
    """Each record's memory split, one row per device (records without one give none)."""
    parts = (*MEMORY_PARTS, *ALLOCATOR_PARTS, *HOST_PARTS)  # a part a record lacks: NaN
    rows = [
        {"cell": rec["cell"], "device": device, **{part: _part(rec["memory"], part, device) for part in parts}}
        for _, rec in records
        if rec.get("memory")
        for device in range(len(rec["memory"]["peak_mb"]))
    ]
    return pd.DataFrame(rows, columns=["cell", "device", *parts], dtype=object).astype({p: float for p in parts})


def _part(memory: dict, part: str, device: int) -> float | None:
    values = memory.get(part)
    return None if values is None else values[device]


def split_table(measured: pd.DataFrame, plan: pd.DataFrame | None, cells: pd.DataFrame) -> pd.DataFrame:
    """memory_split (see the module docstring) for the cells of the cells table."""
    known = cells[["cell", "mode"]]
    if plan is None or plan.empty:
        plan = pd.DataFrame(columns=["cell", "device", *PLANNED, "reason"])
    plan = plan.reindex(columns=[c for c in plan.columns if c != "skip"])
    for late in ("allocated_mb", "workspace_mb"):  # a plan made before it predicted them
        if late not in plan:
            plan = plan.assign(**{late: float("nan")})
    predicted = plan.rename(columns={**dict(zip(PLANNED, PREDICTED)), "reason": "plan_reason"})
    predicted = predicted[predicted["cell"].isin(known["cell"])]
    reasons = predicted[predicted["device"].isna()][["cell", "plan_reason"]]
    predicted = predicted.dropna(subset=["device"]).drop(columns="plan_reason").astype({"device": int})
    table = measured.astype({"device": int}).merge(predicted, on=["cell", "device"], how="outer")
    table = table.merge(reasons, on="cell", how="outer").merge(known, on="cell", how="left")
    by_allocator = table["allocated_mb"].notna() & table["predicted_allocated_mb"].notna()
    predicted_peak = table["predicted_allocated_mb"].where(by_allocator, table["predicted_peak_mb"])
    measured_peak = table["allocated_mb"].where(by_allocator, table["peak_mb"])
    table = table.assign(
        against=by_allocator.map({True: "allocator", False: "tracker"}).where(measured_peak.notna()),
        error_pct=(predicted_peak - measured_peak) / measured_peak * 100,
    )
    table = table.reindex(columns=list(SPLIT_COLUMNS))
    return table.astype({"device": "Int64"}).sort_values(["cell", "device"], ignore_index=True)


def accuracy_table(split: pd.DataFrame) -> pd.DataFrame:
    """memory_accuracy (see the module docstring); empty when no device has both numbers."""
    both = split.dropna(subset=["error_pct"])
    groups = [
        ((against, mode), part)
        for against, kind in both.groupby("against")
        for mode, part in [*kind.groupby("mode"), ("all", kind)]
    ]
    rows = [
        {
            "against": against,
            "mode": mode,
            "devices": len(part),
            "median_abs_error_pct": part["error_pct"].abs().median(),
            "max_abs_error_pct": part["error_pct"].abs().max(),
            "target_pct": TARGET_PCT,
            "within_target": bool((part["error_pct"].abs() <= TARGET_PCT).all()),
            "activations_mb": part["activations_mb"].median(),
            "rss_growth_mb": part["rss_growth_mb"].median(),
        }
        for (against, mode), part in groups
    ]
    return pd.DataFrame(rows, columns=list(ACCURACY_COLUMNS))


def per_cell(split: pd.DataFrame) -> pd.DataFrame:
    """Per cell with a measured split: its fullest and emptiest device's peak and its fullest
    device's model state (parameters, gradients, optimizer state)."""
    measured = split.dropna(subset=["peak_mb"])
    measured = measured.assign(state_mb=measured[list(STATE_PARTS)].sum(axis=1))
    grouped = measured.groupby("cell")
    return pd.DataFrame(
        {
            "peak_max": grouped["peak_mb"].max(),
            "peak_min": grouped["peak_mb"].min(),
            "state_mb": grouped["state_mb"].max(),
        }
    )


def spread_table(split: pd.DataFrame, cells: pd.DataFrame) -> pd.DataFrame:
    """memory_spread (see the module docstring)."""
    measured = cells.join(per_cell(split), on="cell")
    baselines = Baselines(measured.dropna(subset=["state_mb"]))
    multi = measured[(measured["status"] == "ok") & (measured["devices"] > 1)].dropna(subset=["state_mb"])
    rows = []
    for _, cell in multi.iterrows():
        base = baselines.of(cell)
        if base.empty:
            continue
        base_state = base["state_mb"].median()
        rows.append(
            {
                "mode": cell["mode"],
                "shard": cell["shard"],
                "devices": cell["devices"],
                "cell": cell["cell"],
                "imbalance": cell["peak_max"] / cell["peak_min"],
                "state_share": cell["state_mb"] / base_state,
                "state_mb": cell["state_mb"],
                "baseline_state_mb": base_state,
            }
        )
    if not rows:
        return pd.DataFrame(columns=list(SPREAD_COLUMNS))
    grouped = pd.DataFrame(rows).groupby(["mode", "shard", "devices"], sort=True)
    medians = grouped[["imbalance", "state_share"]].median()
    # the example: the cell at the median share, with its own MB (cells of several models differ)
    examples = grouped.apply(
        lambda g: g.sort_values(["state_share", "cell"]).iloc[(len(g) - 1) // 2], include_groups=False
    )
    table = medians.join(grouped.size().rename("cells")).join(
        examples[["cell", "state_mb", "baseline_state_mb"]].rename(columns={"cell": "example"})
    )
    return table.reset_index()[list(SPREAD_COLUMNS)]
