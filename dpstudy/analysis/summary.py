"""Study-level figures the report states, each a column of a table:

summary     one row: how many multi-device settings have each speedup verdict, the noise of one
            device (CV of the single-device settings' throughput), the machine's floor
            (dpstudy.analysis.floor), and the runs that shared the host
data_wait   the share of the steady training time spent waiting for data, by loader and by setup
memory      per finished multi-device cell: its fullest device's peak memory over its emptiest's
util_means  per cell and GPU: the mean utilisation of the sampled run
"""

from __future__ import annotations

import math

import pandas as pd

from dpstudy.analysis import floor as machine_floor
from dpstudy.analysis.stats import VERDICTS
from dpstudy.study import modes

BUSY_CORES = 0.25  # other processes' mean CPU (cores) above which a run counts as measured on a busy host
VERDICT_COLUMNS = {v: v.replace(" ", "_") for v in VERDICTS}  # faster, slower, within_noise, noisier
SUMMARY_COLUMNS = (
    "multi_settings",
    *VERDICT_COLUMNS.values(),
    "noise_floor_settings",
    "noise_floor_median_cv",
    "noise_floor_max_cv",
    *machine_floor.SUMMARY_COLUMNS,
    "machine_settings",
    "machine_median_cv",
    "machine_max_cv",
    "near_machine",
    "finished_cells",
    "busy_cores",
    "busy_cells",
    "other_load_max",
    "busy_other_load_max",
)
LOADER_KEYS = ("loader", "workers", "augment")
SETUP_KEYS = ("mode", "shard", "backend", "gpus", "nodes")
WAIT_COLUMNS = ("by", *LOADER_KEYS, *SETUP_KEYS, "data_wait_s", "wall_s", "share")
MEMORY_COLUMNS = (
    "cell",
    "mode",
    "backend",
    "gpus",
    "nodes",
    "devices",
    "peak_mem_mb_max",
    "peak_mem_mb_min",
    "imbalance",
    "largest",
)
UTIL_MEAN_COLUMNS = ("cell", "device", "samples", "gpu_util")


def finished(cells: pd.DataFrame) -> pd.DataFrame:
    return cells[cells["status"] == "ok"]


def maximum(values: pd.Series) -> float:
    return float(values.max()) if values.notna().any() else math.nan


def summary_table(cells: pd.DataFrame, settings: pd.DataFrame, floor: pd.DataFrame) -> pd.DataFrame:
    """One row.

    multi_settings: the multi-device settings with a speedup; faster ... noisier: how many of them
    have each verdict (settings' `verdict`). noise_floor_settings: the single-device settings with a
    noise (two or more repeats); noise_floor_median_cv / _max_cv: the median and the largest of
    their `noise_cv`. floor_*: the floor runs (`floor`, the floor table) and their CVs
    (dpstudy.analysis.floor.floor_summary). finished_cells: the cells that finished; busy_cells:
    those during which other processes used more than `busy_cores` cores on average (cells'
    `other_load`); other_load_max: the most any finished cell saw, busy_other_load_max the most a
    busy one saw (NaN: none). machine_settings: the settings (any mode) with both a noise and a
    `machine_cv` (the in-cell gauge's CV over the same repeats); machine_median_cv / _max_cv over
    them; near_machine: how many are steady or near the machine's own moving (noise_cv <=
    machine_floor.steady_bound(machine_cv))."""
    multi = settings[(settings["devices"] > 1) & settings["speedup"].notna()]
    singles = settings[(settings["mode"] == modes.BASELINE) & (settings["devices"] == 1) & settings["noise_cv"].notna()]
    ok = finished(cells)
    busy = ok[ok["other_load"] > BUSY_CORES]
    gauged = settings[settings["noise_cv"].notna() & settings["machine_cv"].notna()]
    row = {
        "multi_settings": len(multi),
        **{column: int((multi["verdict"] == v).sum()) for v, column in VERDICT_COLUMNS.items()},
        "noise_floor_settings": len(singles),
        "noise_floor_median_cv": singles["noise_cv"].median() if len(singles) else math.nan,
        "noise_floor_max_cv": maximum(singles["noise_cv"]),
        **machine_floor.floor_summary(floor, maximum(singles["noise_cv"])),
        "machine_settings": len(gauged),
        "machine_median_cv": gauged["machine_cv"].median() if len(gauged) else math.nan,
        "machine_max_cv": maximum(gauged["machine_cv"]),
        "near_machine": int((gauged["noise_cv"] <= machine_floor.steady_bound(gauged["machine_cv"])).sum()),
        "finished_cells": len(ok),
        "busy_cores": BUSY_CORES,
        "busy_cells": len(busy),
        "other_load_max": maximum(ok["other_load"]),
        "busy_other_load_max": maximum(busy["other_load"]),
    }
    return pd.DataFrame([row], columns=list(SUMMARY_COLUMNS))


def steady_epochs(epochs: pd.DataFrame, cells: pd.DataFrame) -> pd.DataFrame:
    """Epochs of finished cells after the warm-up epoch."""
    return epochs[~epochs["warmup"].astype(bool) & epochs["cell"].isin(finished(cells)["cell"])]


def wait_table(cells: pd.DataFrame, epochs: pd.DataFrame) -> pd.DataFrame:
    """data_wait: steady epochs of finished cells, summed per group; share = data_wait_s / wall_s.

    by "loader": per loader and workers (and augment, when the study varies it; else empty), the
    largest share first. by "setup": per mode, shard, backend, gpus and nodes, in that order."""
    steady = steady_epochs(epochs, cells)
    rows = []
    if not steady.empty:
        loader_keys = ["loader", "workers"] + (["augment"] if steady["augment"].nunique() > 1 else [])
        for by, keys in (("loader", loader_keys), ("setup", list(SETUP_KEYS))):
            sums = [
                {
                    "by": by,
                    **dict(zip(keys, key)),
                    "data_wait_s": part["data_wait_s"].sum(),
                    "wall_s": part["wall_s"].sum(),
                }
                for key, part in steady.groupby(keys)
            ]
            shares = pd.Series([r["data_wait_s"] / r["wall_s"] for r in sums], dtype=float)
            order = shares.sort_values(ascending=False).index if by == "loader" else shares.index
            rows += [{**sums[i], "share": shares[i]} for i in order]
    table = pd.DataFrame(rows, columns=list(WAIT_COLUMNS))
    return table.astype(
        {"workers": "Int64", "gpus": "Int64", "nodes": "Int64", "data_wait_s": float, "wall_s": float, "share": float}
    )


def memory_table(cells: pd.DataFrame) -> pd.DataFrame:
    """memory: every finished multi-device cell with both peaks (last epoch); imbalance = the
    fullest device's peak / the emptiest's; `largest` marks the cell of each mode with the largest
    imbalance (the first of equals, in cell order)."""
    ok = finished(cells[cells["devices"] > 1]).dropna(subset=["peak_mem_mb_max", "peak_mem_mb_min"])
    table = ok[[c for c in MEMORY_COLUMNS if c in ok]].assign(
        imbalance=ok["peak_mem_mb_max"] / ok["peak_mem_mb_min"], largest=False
    )
    for _, rows in table.groupby("mode"):
        table.loc[rows["imbalance"].idxmax(), "largest"] = True
    return table.astype({"imbalance": float, "largest": bool})[list(MEMORY_COLUMNS)].reset_index(drop=True)


def util_means(util: pd.DataFrame) -> pd.DataFrame:
    """util_means: per cell and GPU, the number of samples and their mean `gpu_util` (%)."""
    grouped = util.groupby(["cell", "device"])["gpu_util"]
    table = pd.DataFrame({"samples": grouped.size(), "gpu_util": grouped.mean()}).reset_index()
    return table.reindex(columns=list(UTIL_MEAN_COLUMNS))
