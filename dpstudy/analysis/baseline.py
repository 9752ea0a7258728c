"""The one rule for a cell's single-device baseline, used by the cells table (per-repeat speedup),
the settings table (the speedup's interval) and the step model alike.

The baseline of a cell is the set of finished single-device cells (mode single, one device of one
node) whose every spec key equals the cell's, except mode, gpus, nodes, backend, data_root,
repeat, batch_scope and lr_scaling (the last two are no-ops on one device), and which ran on the
same kind of device. Both batch scopes therefore compare at equal `batch`: under per_device the
baseline has the cell's per-device batch, under global the cell's global batch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import pandas as pd

from dpstudy.analysis.keys import BASELINE_KEYS
from dpstudy.study import modes


def baseline_cells(cells: pd.DataFrame) -> pd.DataFrame:
    """The finished single-device cells: the only cells a baseline is taken from."""
    return cells[
        (cells["status"] == "ok")
        & (cells["mode"] == modes.BASELINE)
        & (cells["devices"] == 1)
        & cells["samples_per_s"].notna()
    ]


def baseline_key(values: Iterable) -> tuple:
    """BASELINE_KEYS values as a dict key: a missing value (None, NaN, NA) is None, so that it
    matches a missing one; 64 and 64.0 (and True and 1) match as pandas' == matches them."""
    return tuple(None if pd.isna(v) else v for v in values)


class Baselines:
    """The baseline cells of a table indexed by BASELINE_KEYS, so that the baseline of each of
    thousands of rows is a dict lookup (comparing every key column per row cost a minute at 3,000
    cells). Build it once per table and ask `of(row)` for each row."""

    def __init__(self, cells: pd.DataFrame):
        self.singles = baseline_cells(cells)
        self.positions: dict[tuple, list[int]] = {}
        for position, values in enumerate(zip(*(self.singles[k].tolist() for k in BASELINE_KEYS))):
            self.positions.setdefault(baseline_key(values), []).append(position)
        self.taken: dict[tuple, pd.DataFrame] = {}

    def of(self, row) -> pd.DataFrame:
        """The baseline cells of `row` (a table row or a dict with BASELINE_KEYS)."""
        key = baseline_key(row[k] for k in BASELINE_KEYS)
        if key not in self.taken:
            self.taken[key] = self.singles.iloc[self.positions.get(key, [])]
        return self.taken[key]  # shared between the rows of a setting: callers only read it


def geometric_mean(values: pd.Series) -> float:
    return float(np.exp(np.log(values).mean())) if len(values) else math.nan


def with_speedup(cells: pd.DataFrame) -> pd.DataFrame:
    """Add baseline, speedup and efficiency to the cells table.

    `baseline` names the first repeat of the cell's baseline. speedup = this repeat's samples_per_s
    / the geometric mean of the baseline's repeats (the baseline throughput of the setting's speedup
    in dpstudy.analysis.stats), efficiency = speedup / devices (gpus x nodes); both stay empty when
    the cell did not finish or has no baseline."""
    baselines = Baselines(cells)
    first, rate = [], []
    for row in cells[list(BASELINE_KEYS)].to_dict("records"):
        base = baselines.of(row).sort_values(["repeat", "cell"])
        first.append(base["cell"].iloc[0] if len(base) else None)
        rate.append(geometric_mean(base["samples_per_s"]))
    out = cells.drop(columns=["baseline", "speedup", "efficiency"], errors="ignore").copy()
    out["baseline"] = first
    out["speedup"] = (out["samples_per_s"] / pd.Series(rate, index=out.index, dtype=float)).where(out["status"] == "ok")
    out["efficiency"] = out["speedup"] / out["devices"].astype(float)
    return out
