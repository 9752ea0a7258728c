"""The overview of a study of many settings, as numbers (dpstudy.report.overview phrases them):

varied  one row per setting key that takes more than one value: how many values it takes
pivot   the medians over the settings that share the values of the two keys with the most values
        (`axis_keys`): of "multi", speedup and efficiency over the multi-device settings; of
        "all", final test accuracy over every setting. The other varied keys are folded in.
"""

from __future__ import annotations

import pandas as pd

from dpstudy.analysis.stats import varied_keys

VARIED_COLUMNS = ("key", "values")
PIVOT_COLUMNS = ("of", "row_key", "row", "column_key", "column", "settings", "speedup", "efficiency", "final_test_acc")
METRICS = {"multi": ("speedup", "efficiency"), "all": ("final_test_acc",)}


def values_of(settings: pd.DataFrame, key: str) -> int:
    return settings[key].nunique(dropna=False)


def same_partition(settings: pd.DataFrame, a: str, b: str) -> bool:
    """True when `a` and `b` split the settings identically (batch and global batch on one device
    count): a pivot over both would be a diagonal."""
    pairs = settings[[a, b]].drop_duplicates().shape[0]
    return pairs == values_of(settings, a) == values_of(settings, b)


def axis_keys(settings: pd.DataFrame, exclude: tuple[str, ...] = (), count: int = 2) -> list[str]:
    """The `count` varied keys with the most values (ties: SETTING_KEYS order), skipping those in
    `exclude` and any that only restates a key already chosen."""
    candidates = [k for k in varied_keys(settings) if k not in exclude]
    chosen: list[str] = []
    for key in sorted(candidates, key=lambda k: -values_of(settings, k)):
        if len(chosen) < count and not any(same_partition(settings, key, c) for c in chosen):
            chosen.append(key)
    return chosen


def varied_table(settings: pd.DataFrame) -> pd.DataFrame:
    """varied: each varied key (SETTING_KEYS order) and its number of values, missing counted."""
    return pd.DataFrame([(k, values_of(settings, k)) for k in varied_keys(settings)], columns=list(VARIED_COLUMNS))


def pivot_table(settings: pd.DataFrame) -> pd.DataFrame:
    """pivot: per `of` and square (row, column: values of row_key and column_key, the axis keys;
    column_key empty with one varied key), the number of settings and the medians of its metrics
    (see the module's docstring); empty when no key varies."""
    keys = axis_keys(settings)
    if not keys:
        return pd.DataFrame(columns=list(PIVOT_COLUMNS))
    rows_key, cols_key = keys[0], keys[1] if len(keys) > 1 else None
    rows = []
    for of, frame in (("multi", settings[settings["devices"] > 1]), ("all", settings)):
        for key, group in frame.groupby([rows_key, cols_key] if cols_key else [rows_key], dropna=False, sort=True):
            rows.append(
                {
                    "of": of,
                    "row_key": rows_key,
                    "row": key[0],
                    "column_key": cols_key,
                    "column": key[1] if cols_key else None,
                    "settings": len(group),
                    **{m: group[m].median() for m in METRICS[of]},
                }
            )
    return pd.DataFrame(rows, columns=list(PIVOT_COLUMNS))


def overview_tables(settings: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """{"varied", "pivot"} of a settings table."""
    return {"varied": varied_table(settings), "pivot": pivot_table(settings)}
