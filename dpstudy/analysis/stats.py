"""Repeats -> estimates with 95 % intervals, and the one definition of a setting's speedup.

`repeats: k` runs k seeds of a cell. Throughput is summarised on the log scale: a setting's
throughput is the geometric mean of its repeats, and its speedup is the ratio of the geometric
means of the setting and its single-device baseline (`speedup`, the ONE speedup every table,
sentence, figure and the step model quote). The 95 % interval is Welch's t-interval on the
difference of mean log throughputs, mapped back by exp: throughput noise is multiplicative, and
on the log scale the interval is symmetric around its point, with Welch's degrees of freedom
for unequal noise and repeat counts (scipy.stats.ttest_ind with equal_var=False computes it).
This method was chosen by evidence: for simulated log-normal repeats (CV 3 %, 5 %, 20 %;
n = 3, 5, 10) its intervals hold the true ratio 95.7-96 % of the time
(tests/unit/analysis/test_stats.py; benchmarks/interval_coverage.py prints the figures), while the
percentile bootstrap of medians that came before held it 89.6 % of the time at n = 3, with its
point near one edge.

Accuracy and other additive quantities use the plain t-interval on the mean. With fewer than two
runs on a side there is no interval (NaN bounds): the report prints the number and says so.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from dpstudy.analysis.baseline import Baselines
from dpstudy.analysis.keys import SETTING_KEYS
from dpstudy.record.fields import IN_CELL_RATES
from dpstudy.study import modes

LEVEL = 0.95
METHOD = "Welch t-interval on log throughput"
Estimate = tuple[float, float, float]  # (point, low, high); NaN bounds: no interval
NO_VALUE: Estimate = (math.nan, math.nan, math.nan)
METRICS = ("samples_per_s", "speedup", "efficiency", "final_test_acc")
SETTING_COLUMNS = (
    "repeats",
    "cells",
    "baseline_repeats",
    "noise_cv",
    "machine_cv",
    "baseline_noise_cv",
    "noisy",
    "other_load",
    *(f"{m}{p}" for m in METRICS for p in ("", "_low", "_high")),
    "setting",
    "noise_max_cv",
    "effect",
    "verdict",
    "learned",
)
# A setting's speedup against one device, as the report words it (`verdict`): the interval above,
# below or around 1, or its noise larger than its effect; none without an interval or for one device.
VERDICTS = ("faster", "slower", "within noise", "noisier")


def clean(values: Sequence[float]) -> np.ndarray:
    return np.asarray([v for v in values if pd.notna(v)], dtype=float)


def t_quantile(df: float) -> float:
    return float(scipy_stats.t.ppf((1 + LEVEL) / 2, df))


def mean_interval(values: Sequence[float], log: bool = False) -> Estimate:
    """Mean (geometric when `log`) and its t-interval; no bounds for fewer than two values."""
    data = clean(values)
    if log:
        data = np.log(data[data > 0])
    if len(data) == 0:
        return NO_VALUE
    back = np.exp if log else (lambda v: v)
    mean = float(data.mean())
    if len(data) < 2:
        return (float(back(mean)), math.nan, math.nan)
    half = t_quantile(len(data) - 1) * data.std(ddof=1) / math.sqrt(len(data))
    return (float(back(mean)), float(back(mean - half)), float(back(mean + half)))


def welch(a: np.ndarray, b: np.ndarray) -> Estimate:
    """(difference of means a - b, and its interval at LEVEL): Welch's t-interval, scipy's
    ttest_ind with unequal variances (Welch-Satterthwaite degrees of freedom). NaN bounds with
    fewer than two values on a side; no width when neither side varies (scipy's degrees of freedom
    would be 0/0: no interval at all)."""
    diff = float(a.mean() - b.mean())
    if len(a) < 2 or len(b) < 2:
        return (diff, math.nan, math.nan)
    if a.var(ddof=1) == 0 and b.var(ddof=1) == 0:
        return (diff, diff, diff)
    with warnings.catch_warnings():
        # scipy warns of precision loss whenever one side's values are all equal (a steady
        # baseline), though its variance is then exactly 0 and the interval the other side's alone
        warnings.filterwarnings("ignore", "Precision loss occurred in moment calculation", RuntimeWarning)
        low, high = scipy_stats.ttest_ind(a, b, equal_var=False).confidence_interval(confidence_level=LEVEL)
    return (diff, float(low), float(high))


def ratio(numerator: Sequence[float], denominator: Sequence[float]) -> Estimate:
    """Ratio of geometric means with Welch's t-interval on the log scale (see the docstring)."""
    top, bottom = clean(numerator), clean(denominator)
    top, bottom = top[top > 0], bottom[bottom > 0]
    if len(top) == 0 or len(bottom) == 0:
        return NO_VALUE
    diff, low, high = welch(np.log(top), np.log(bottom))
    return (math.exp(diff), math.exp(low), math.exp(high))


def difference(a: Sequence[float], b: Sequence[float]) -> Estimate:
    """Difference of means (a - b) with Welch's t-interval."""
    top, bottom = clean(a), clean(b)
    if len(top) == 0 or len(bottom) == 0:
        return NO_VALUE
    return welch(top, bottom)


def cv(values: Sequence[float]) -> float:
    """Coefficient of variation (sample standard deviation / mean): a setting's noise."""
    data = clean(values)
    if len(data) < 2 or data.mean() == 0:
        return math.nan
    return float(data.std(ddof=1) / data.mean())


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


def interval_text(
    value: tuple[float, float, float], form: str | Callable[[float], str] = "{:.2f}", unit: str = ""
) -> str:
    """'1.52x [1.41-1.60]', or just the number when there is no interval. `form` is a format
    string or a function of the number."""
    fmt = form.format if isinstance(form, str) else form
    point, low, high = value
    if not has_interval(low, high):
        return f"{fmt(point)}{unit}"
    return f"{fmt(point)}{unit} [{fmt(low)}-{fmt(high)}]"


def machine_cv(group: pd.DataFrame) -> float:
    """How much the machine itself moved between a setting's repeats: the larger CV over them of the
    in-cell gauge's two rates (dpstudy.engine.reference.InCell), the floor at the cells' own
    moments; NaN with fewer than two repeats that measured it."""
    cvs = [cv(group[rate]) for rate in IN_CELL_RATES if rate in group]
    cvs = [c for c in cvs if pd.notna(c)]
    return max(cvs) if cvs else math.nan


def settings_table(cells: pd.DataFrame) -> pd.DataFrame:
    """One row per setting of the finished cells: repeats; throughput (geometric mean), speedup
    (`ratio` against every repeat of the baseline setting), efficiency (speedup / devices) and
    final test accuracy (mean), each with its 95 % interval; the noise (CV of throughput over
    the repeats) of the setting and of its baseline, the machine's own over the same repeats
    (`machine_cv`), and whether that noise is larger than the
    speedup's distance from 1 (`noisy`: the effect the setting would claim).

    `setting` numbers the rows (0, 1, ... in table order: what other tables name a setting by);
    `noise_max_cv` is the larger of the two noises (NaN when neither has repeats), `effect` the
    speedup's distance from 1, and `verdict` one of VERDICTS (see `verdict`), empty for a
    single-device setting, which is its own baseline."""
    ok = cells[(cells["status"] == "ok") & cells["samples_per_s"].notna()]
    baselines = Baselines(ok)
    rows = []
    for key, group in ok.groupby(SETTING_KEYS, dropna=False, sort=True):
        setting = dict(zip(SETTING_KEYS, key))
        base = baselines.of(setting)
        row = {
            **setting,
            "repeats": len(group),
            "cells": " ".join(sorted(group["cell"])),
            "baseline_repeats": len(base),
            "noise_cv": cv(group["samples_per_s"]),
            "machine_cv": machine_cv(group),
            "baseline_noise_cv": cv(base["samples_per_s"]),
            # the most CPU other processes took while a repeat trained (dpstudy.engine.monitor.HostLoad)
            "other_load": group["other_load"].max() if "other_load" in group else math.nan,
        }
        for name, value in (
            ("samples_per_s", mean_interval(group["samples_per_s"], log=True)),
            ("final_test_acc", mean_interval(group["final_test_acc"])),
            ("speedup", ratio(group["samples_per_s"], base["samples_per_s"])),
        ):
            row.update({name: value[0], f"{name}_low": value[1], f"{name}_high": value[2]})
        for part in ("", "_low", "_high"):
            row[f"efficiency{part}"] = row[f"speedup{part}"] / setting["devices"]
        noise = np.nanmax([row["noise_cv"], row["baseline_noise_cv"], -1.0])
        own_baseline = setting["mode"] == modes.BASELINE and setting["devices"] == 1  # claims no effect
        row["noisy"] = bool(pd.notna(row["speedup"]) and not own_baseline and noise > abs(row["speedup"] - 1))
        row["setting"] = len(rows)
        row["noise_max_cv"] = noise if noise >= 0 else math.nan
        row["effect"] = abs(row["speedup"] - 1)
        row["verdict"] = None if own_baseline else verdict(row)
        row["learned"] = learned(group)
        rows.append(row)
    return pd.DataFrame(rows, columns=[*SETTING_KEYS, *SETTING_COLUMNS])


def learned(finished: pd.DataFrame) -> bool | None:
    """False when any of these finished cells did not learn (dpstudy.record.learning), True when
    all did; None without a verdict (none finished, or records made before it)."""
    verdicts = finished["learned"].dropna() if "learned" in finished else pd.Series(dtype=object)
    return None if verdicts.empty else bool(verdicts.astype(bool).all())


def verdict(row) -> str | None:
    """The speedup's verdict (VERDICTS): "noisier" when the setting is `noisy`, else where the 95 %
    interval lies against 1; None without an interval."""
    if row["noisy"]:
        return "noisier"
    if not has_interval(row["speedup_low"], row["speedup_high"]):
        return None
    return {1: "faster", -1: "slower", 0: "within noise"}[versus(value(row, "speedup"), 1.0)]


def speedups(settings: pd.DataFrame) -> pd.DataFrame:
    """The settings' speedups with their intervals, indexed by the setting keys: what any other
    table (the step model's) joins to quote THE speedup."""
    return settings.set_index(SETTING_KEYS)[["speedup", "speedup_low", "speedup_high"]]


def varied_keys(settings: pd.DataFrame, keys: Sequence[str] | None = None) -> list[str]:
    """The setting keys that take more than one value in `settings` (missing counts as a value):
    what a sentence or a table row must name to tell two settings apart."""
    return [k for k in (keys or SETTING_KEYS) if k in settings and settings[k].nunique(dropna=False) > 1]


def value(row, metric: str) -> tuple[float, float, float]:
    """(median, low, high) of `metric` in a settings_table row."""
    return (row[metric], row[f"{metric}_low"], row[f"{metric}_high"])
