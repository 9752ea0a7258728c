"""Repeats -> medians and 95 % intervals, and the rule for claiming a difference.

`repeats: k` runs k seeds of a cell. Every summary here is the median over the repeats with a
95 % percentile bootstrap interval (seeded, so a report is reproducible). A speedup's interval
resamples the cell's repeats and its baseline's independently. With one run there is no
interval (NaN bounds), and nothing is claimed beyond the one number.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

RESAMPLES = 2000
LEVEL = 0.95
SEED = 0


def bootstrap(values: Sequence[float], statistic=np.median) -> tuple[float, float, float]:
    """(median, low, high) of `values`; the bounds are NaN for fewer than two values."""
    data = np.asarray([v for v in values if pd.notna(v)], dtype=float)
    if len(data) == 0:
        return (np.nan, np.nan, np.nan)
    point = float(statistic(data))
    if len(data) < 2:
        return (point, np.nan, np.nan)
    rng = np.random.default_rng(SEED)
    samples = statistic(rng.choice(data, size=(RESAMPLES, len(data)), replace=True), axis=1)
    low, high = np.quantile(samples, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return (point, float(low), float(high))


def ratio(numerator: Sequence[float], denominator: Sequence[float]) -> tuple[float, float, float]:
    """(median ratio, low, high): medians of independent resamples of both groups."""
    top = np.asarray([v for v in numerator if pd.notna(v)], dtype=float)
    bottom = np.asarray([v for v in denominator if pd.notna(v)], dtype=float)
    if len(top) == 0 or len(bottom) == 0:
        return (np.nan, np.nan, np.nan)
    point = float(np.median(top) / np.median(bottom))
    if len(top) + len(bottom) < 3:
        return (point, np.nan, np.nan)
    rng = np.random.default_rng(SEED)
    tops = np.median(rng.choice(top, size=(RESAMPLES, len(top))), axis=1)
    bottoms = np.median(rng.choice(bottom, size=(RESAMPLES, len(bottom))), axis=1)
    low, high = np.quantile(tops / bottoms, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return (point, float(low), float(high))


def has_interval(low: float, high: float) -> bool:
    return pd.notna(low) and pd.notna(high)


def compare(a: tuple[float, float, float], b: tuple[float, float, float]) -> int:
    """+1 when a is above b beyond both intervals, -1 below, 0 within noise (or no intervals)."""
    (_, a_low, a_high), (_, b_low, b_high) = a, b
    if not (has_interval(a_low, a_high) and has_interval(b_low, b_high)):
        return 0
    if a_low > b_high:
        return 1
    if a_high < b_low:
        return -1
    return 0


def versus(value: tuple[float, float, float], reference: float) -> int:
    """+1 when the whole interval is above `reference`, -1 below, 0 when it contains it."""
    _, low, high = value
    if not has_interval(low, high):
        return 0
    return 1 if low > reference else -1 if high < reference else 0


def interval_text(value: tuple[float, float, float], form: str | Callable[[float], str] = "{:.2f}",
                  unit: str = "") -> str:
    """'1.52x [1.41-1.60]', or just the number when there is no interval. `form` is a format
    string or a function of the number."""
    fmt = form.format if isinstance(form, str) else form
    point, low, high = value
    if not has_interval(low, high):
        return f"{fmt(point)}{unit}"
    return f"{fmt(point)}{unit} [{fmt(low)}-{fmt(high)}]"


def settings_table(cells: pd.DataFrame) -> pd.DataFrame:
    """One row per setting of the finished cells: repeats, and median [95 % interval] of throughput,
    speedup (against every repeat of the baseline setting), efficiency and final test accuracy."""
    from dpstudy.collect import SETTING_KEYS, same_baseline

    ok = cells[(cells["status"] == "ok") & cells["samples_per_s"].notna()]
    singles = ok[(ok["mode"] == "single") & (ok["devices"] == 1)]
    rows = []
    for key, group in ok.groupby(SETTING_KEYS, dropna=False, sort=True):
        setting = dict(zip(SETTING_KEYS, key))
        base = same_baseline(singles, setting)
        row = {**setting, "repeats": len(group), "cells": " ".join(sorted(group["cell"]))}
        for name, value in (("samples_per_s", bootstrap(group["samples_per_s"])),
                            ("final_test_acc", bootstrap(group["final_test_acc"])),
                            ("speedup", ratio(group["samples_per_s"], base["samples_per_s"]))):
            row.update({name: value[0], f"{name}_low": value[1], f"{name}_high": value[2]})
        for part in ("", "_low", "_high"):
            row[f"efficiency{part}"] = row[f"speedup{part}"] / setting["devices"]
        rows.append(row)
    metrics = [f"{m}{p}" for m in ("samples_per_s", "speedup", "efficiency", "final_test_acc")
               for p in ("", "_low", "_high")]
    return pd.DataFrame(rows, columns=[*SETTING_KEYS, "repeats", "cells", *metrics])


def value(row, metric: str) -> tuple[float, float, float]:
    """(median, low, high) of `metric` in a settings_table row."""
    return (row[metric], row[f"{metric}_low"], row[f"{metric}_high"])
