"""Will a forecast setting fit? Its predicted memory per device with the margins the memory plan's
budget uses (dpstudy.study.budget.need_of: the allocator's fragmentation and, on CUDA, the
context), against what a device offers: the study's memory_budget_gib where it sets one, else on
CUDA the smallest device its cells recorded (memory_split's total_mb); a CPU study without a budget
has no capacity to compare with, and its rows say nothing (NA).

Columns added to a forecasts table: need_mb, capacity_mb, fits.
"""

from __future__ import annotations

import math

import pandas as pd

from dpstudy.study.budget import GIB, need_of


def measured(split: pd.DataFrame | None, column: str, how: str) -> float:
    """The CUDA cells' `column` of memory_split (context_mb median, total_mb min); NaN without one."""
    if split is None or column not in split:
        return math.nan
    values = split[column].dropna()
    return float(getattr(values, how)()) if len(values) else math.nan


def with_fit(table: pd.DataFrame, split: pd.DataFrame | None, budget_gib: float | None) -> pd.DataFrame:
    """`table` (the forecasts) with each forecast's need, the capacity it is held against and
    whether it fits (NA where no memory was forecast or no capacity is known)."""
    context = measured(split, "context_mb", "median")
    device_total = measured(split, "total_mb", "min")
    need, capacity, fits = [], [], []
    for _, row in table.iterrows():
        on_cuda = row.get("env_device") == "cuda"
        mb = row.get("predicted_memory_mb")
        has = mb is not None and pd.notna(mb)
        need.append(need_of(mb, on_cuda, None if math.isnan(context) else context) if has else math.nan)
        capacity.append(budget_gib * GIB if budget_gib else (device_total if on_cuda else math.nan))
        fits.append(pd.NA if not has or math.isnan(capacity[-1]) else bool(need[-1] <= capacity[-1]))
    return table.assign(need_mb=need, capacity_mb=capacity, fits=pd.array(fits, dtype="boolean"))
