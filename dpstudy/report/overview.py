"""A study of many settings at a glance: what varies, a pivot of the medians, the extremes.

A study of a thousand settings cannot be read setting by setting; the report shows this summary
instead and points at the tables for the rest. Every number is a column of a table: the medians of
the pivots are the `pivot` table's (dpstudy.analysis.pivots: a pivot entry is the median over the
settings that share the pivot's two keys, so the rest of the varied keys are aggregated, and the text
says which), the number of values of each varied key the `varied` table's; the extremes are rows of
the settings table (dpstudy.analysis.stats.settings_table). This module only phrases them.
"""

from __future__ import annotations

import pandas as pd

from dpstudy.analysis.pivots import axis_keys, same_partition  # noqa: F401 (dpstudy.report.figures imports axis_keys from here)
from dpstudy.report.text import code, markdown_table, plural

# Keys that say how a cell ran (its variant: one line of the figures each, dpstudy.report.figures.layout),
# not a parameter swept along an axis
VARIANT_KEYS = ("mode", "backend", "nodes")
MAX_ROWS = 40


def aggregated(settings: pd.DataFrame, shown: list[str]) -> list[str]:
    """The varied keys a median over `shown` folds together (restatements of shown keys left out)."""
    from dpstudy.analysis.stats import varied_keys

    return [
        k for k in varied_keys(settings) if k not in shown and not any(same_partition(settings, k, s) for s in shown)
    ]


def label(value) -> str:
    """A key's value as a pivot's row or column name: 0.05, 64, ddp, (missing)."""
    if pd.isna(value):
        return "(missing)"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def pivot(squares: pd.DataFrame, cell) -> pd.DataFrame:
    """A markdown-ready table of the `pivot` table's `squares` (rows of one `of`): rows the values
    of row_key, columns those of column_key (or one column), each entry `cell(square)`; empty where
    no setting is."""
    first = squares.iloc[0]
    rows, cols = first["row_key"], first["column_key"] if pd.notna(first["column_key"]) else None
    entries = {
        (square["row"], square["column"] if cols else "median"): cell(square) for _, square in squares.iterrows()
    }
    table = pd.Series(entries, dtype=object)
    table.index = pd.MultiIndex.from_tuples(table.index)
    wide = table.unstack(1)
    header = f"{rows} \\ {cols}" if cols else rows
    wide.index = [label(v) for v in wide.index]
    wide.columns = [label(v) for v in wide.columns]
    return wide.rename_axis(header).reset_index()


def speedup_entry(square) -> str:
    """'2.95x (74 %)': median speedup and efficiency of the settings in a square."""
    speedup, efficiency = square["speedup"], square["efficiency"]
    if pd.isna(speedup):
        return ""
    return f"{speedup:.2f}x ({efficiency * 100:.0f} %)"


def accuracy_entry(square) -> str:
    accuracy = square["final_test_acc"]
    return "" if pd.isna(accuracy) else f"{accuracy * 100:.1f} %"


def capped(table: pd.DataFrame, what: str, limit: int = MAX_ROWS) -> str:
    """The table as markdown, its first `limit` rows only (the rest: a line saying how many)."""
    text = markdown_table(table.head(limit))
    if len(table) > limit:
        text += f"\n\n*{len(table) - limit} more rows of {what} in the settings table.*"
    return text


def varied_line(settings: pd.DataFrame, varied: pd.DataFrame) -> str:
    """The settings and the keys they differ in, with each key's number of values (`varied` table)."""
    if varied.empty:
        return f"{plural(len(settings), 'setting')}; no setting key varies."
    parts = [f"`{r['key']}` ({plural(int(r['values']), 'value')})" for _, r in varied.iterrows()]
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
    return (
        f"**The {limit} highest speedups** (speedup [95 % interval]):\n\n{table(ranked.head(limit))}\n\n"
        f"**The {limit} lowest:**\n\n{table(ranked.tail(limit).iloc[::-1])}"
    )


def overview(
    tables: dict[str, pd.DataFrame], limit: int = 5, tables_dir: str = "results/tables", small: int = 12
) -> str:
    """Markdown: the varied keys, pivots of median speedup / efficiency and final accuracy over the
    two keys with the most values, the `limit` highest and lowest speedups, and where the rest is."""
    settings = tables["settings"]
    pointer = (
        f"Every setting with its interval and repeats: {code(f'{tables_dir}/settings.csv')}; every cell, those "
        f"that did not finish included: {code(f'{tables_dir}/cells.csv')}."
    )
    if settings.empty:
        return f"No setting finished: there is nothing to summarise. {pointer}"
    squares = tables["pivot"]
    keys = [k for k in squares[["row_key", "column_key"]].iloc[0] if pd.notna(k)] if not squares.empty else []
    parts = [varied_line(settings, tables["varied"])]
    multi = settings[settings["devices"] > 1]
    if len(multi) <= small:  # the sections below list every setting: medians over some would only add numbers
        return "\n\n".join([*parts, "Each setting is listed with its interval in the sections below.", pointer])
    if keys:
        speedups, accuracies = squares[squares["of"] == "multi"], squares[squares["of"] == "all"]
        if not multi["speedup"].dropna().empty:
            parts.append(
                f"**Speedup (efficiency)** of the multi-device settings, {folded(multi, keys)}:\n\n"
                + capped(pivot(speedups, speedup_entry), "speedups")
            )
        if not settings["final_test_acc"].dropna().empty:
            parts.append(
                f"**Final test accuracy** of every setting, {folded(settings, keys)}:\n\n"
                + capped(pivot(accuracies, accuracy_entry), "accuracies")
            )
    parts.append(extremes(multi, list(tables["varied"]["key"]) or keys, limit))
    parts.append(pointer)
    return "\n\n".join(p for p in parts if p)
