"""A study of many settings at a glance: what varies, a pivot of the medians, the extremes.

A study of a thousand settings cannot be read setting by setting; the report shows this summary
instead and points at the tables for the rest. Every number is a median of the settings table
(dpstudy.analysis.stats.settings_table): a pivot entry is the median over the settings that share the
pivot's two keys, so the rest of the varied keys are aggregated, and the text says which.
"""
from __future__ import annotations

import pandas as pd

from dpstudy.report.text import code, markdown_table, plural

# Keys that say how a cell ran (one line of the figures each), not a parameter swept along an axis.
SETUP_KEYS = ("mode", "backend", "nodes")
MAX_ROWS = 40


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
    from dpstudy.analysis.stats import varied_keys

    candidates = [k for k in varied_keys(settings) if k not in exclude]
    chosen: list[str] = []
    for key in sorted(candidates, key=lambda k: -values_of(settings, k)):
        if len(chosen) < count and not any(same_partition(settings, key, c) for c in chosen):
            chosen.append(key)
    return chosen


def aggregated(settings: pd.DataFrame, shown: list[str]) -> list[str]:
    """The varied keys a median over `shown` folds together (restatements of shown keys left out)."""
    from dpstudy.analysis.stats import varied_keys

    return [k for k in varied_keys(settings) if k not in shown
            and not any(same_partition(settings, k, s) for s in shown)]


def label(value) -> str:
    """A key's value as a pivot's row or column name: 0.05, 64, ddp, (missing)."""
    if pd.isna(value):
        return "(missing)"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def pivot(settings: pd.DataFrame, keys: list[str], cell) -> pd.DataFrame:
    """A markdown-ready table: rows the first key's values, columns the second's (or one column),
    each entry `cell(group)` of the settings that share them; empty where none."""
    rows, cols = keys[0], keys[1] if len(keys) > 1 else None
    groups = settings.groupby([rows, cols] if cols else [rows], dropna=False, sort=True)
    entries = {key if cols else (key[0], "median"): cell(group) for key, group in groups}
    table = pd.Series(entries, dtype=object)
    table.index = pd.MultiIndex.from_tuples(table.index)
    wide = table.unstack(1)
    header = f"{rows} \\ {cols}" if cols else rows
    wide.index = [label(v) for v in wide.index]
    wide.columns = [label(v) for v in wide.columns]
    return wide.rename_axis(header).reset_index()


def speedup_entry(group: pd.DataFrame) -> str:
    """'2.95x (74 %)': median speedup and efficiency of the settings in `group`."""
    speedup, efficiency = group["speedup"].median(), group["efficiency"].median()
    if pd.isna(speedup):
        return ""
    return f"{speedup:.2f}x ({efficiency * 100:.0f} %)"


def accuracy_entry(group: pd.DataFrame) -> str:
    accuracy = group["final_test_acc"].median()
    return "" if pd.isna(accuracy) else f"{accuracy * 100:.1f} %"


def capped(table: pd.DataFrame, what: str, limit: int = MAX_ROWS) -> str:
    """The table as markdown, its first `limit` rows only (the rest: a line saying how many)."""
    text = markdown_table(table.head(limit))
    if len(table) > limit:
        text += f"\n\n*{len(table) - limit} more rows of {what} in the settings table.*"
    return text


def varied_line(settings: pd.DataFrame) -> str:
    from dpstudy.analysis.stats import varied_keys

    keys = varied_keys(settings)
    if not keys:
        return f"{plural(len(settings), 'setting')}; no setting key varies."
    parts = [f"`{k}` ({plural(values_of(settings, k), 'value')})" for k in keys]
    return f"{plural(len(settings), 'setting')} that differ in " + ", ".join(parts) + "."


def folded(settings: pd.DataFrame, keys: list[str]) -> str:
    rest = aggregated(settings, keys)
    if not rest:
        return "one setting per entry"
    return "median over the settings that differ only in " + ", ".join(f"`{k}`" for k in rest)


def extremes(multi: pd.DataFrame, keys: list[str], limit: int) -> str:
    """The fastest and the slowest `limit` multi-device settings by speedup, every varied key named."""
    from dpstudy.analysis.stats import interval_text, value

    ranked = multi.dropna(subset=["speedup"]).sort_values("speedup", ascending=False, kind="stable")
    if ranked.empty:
        return ""

    def table(rows: pd.DataFrame) -> str:
        shown = pd.DataFrame({k: rows[k].map(label) for k in keys})
        # formatted as every other section quotes a setting's speedup (dpstudy.report.findings)
        shown["speedup"] = [interval_text(value(r, "speedup"), unit="x") for _, r in rows.iterrows()]
        shown["efficiency"] = rows["efficiency"].map(lambda v: f"{v * 100:.0f} %")
        shown["final test accuracy"] = rows["final_test_acc"].map(lambda v: "" if pd.isna(v) else f"{v * 100:.1f} %")
        shown["repeats"] = rows["repeats"]
        return markdown_table(shown)

    if len(ranked) <= 2 * limit:
        return f"**Every multi-device setting by speedup** (speedup [95 % interval]):\n\n{table(ranked)}"
    return (f"**The {limit} highest speedups** (speedup [95 % interval]):\n\n{table(ranked.head(limit))}\n\n"
            f"**The {limit} lowest:**\n\n{table(ranked.tail(limit).iloc[::-1])}")


def overview(tables: dict[str, pd.DataFrame], limit: int = 5, tables_dir: str = "results/tables",
             small: int = 12) -> str:
    """Markdown: the varied keys, pivots of median speedup / efficiency and final accuracy over the
    two keys with the most values, the `limit` highest and lowest speedups, and where the rest is."""
    settings = tables["settings"]
    pointer = (f"Every setting with its interval and repeats: {code(f'{tables_dir}/settings.csv')}; every cell, those "
               f"that did not finish included: {code(f'{tables_dir}/cells.csv')}.")
    if settings.empty:
        return f"No setting finished: there is nothing to summarise. {pointer}"
    keys = axis_keys(settings)
    parts = [varied_line(settings)]
    multi = settings[settings["devices"] > 1]
    if len(multi) <= small:  # the sections below list every setting: medians over some would only add numbers
        return "\n\n".join([*parts, "Each setting is listed with its interval in the sections below.", pointer])
    if keys:
        if not multi["speedup"].dropna().empty:
            parts.append(f"**Speedup (efficiency)** of the multi-device settings, {folded(multi, keys)}:\n\n"
                         + capped(pivot(multi, keys, speedup_entry), "speedups"))
        if not settings["final_test_acc"].dropna().empty:
            parts.append(f"**Final test accuracy** of every setting, {folded(settings, keys)}:\n\n"
                         + capped(pivot(settings, keys, accuracy_entry), "accuracies"))
    from dpstudy.analysis.stats import varied_keys

    parts.append(extremes(multi, varied_keys(settings) or keys, limit))
    parts.append(pointer)
    return "\n\n".join(p for p in parts if p)
