"""Which strategy at the largest batch that fits: per workload up to its batch, each strategy at the
largest per-device batch its memory per device lets through the capacity, and its throughput there,
measured or forecast (the largest_batch table: dpstudy.analysis.largest_batch). Part of the "Which
strategy?" section (findings.strategies)."""

from __future__ import annotations

import pandas as pd

from dpstudy.analysis import stats
from dpstudy.analysis.keys import GROUP_KEYS
from dpstudy.report.findings.phrases import (
    LIST_LIMIT,
    Tables,
    dataset_model,
    extra_keys,
    strategy_label,
    table_csv,
    varied,
    whole,
    work_columns,
)
from dpstudy.report.text import markdown_table, more_in, significant, text
from dpstudy.study.budget import GIB

INTRO = (
    "**At the largest batch that fits.** Each strategy's memory per device is a line in the per-device "
    "batch, through its own batches (measured, or as the memory plan predicted those that did not run) or "
    "else the step model's; its largest per-device batch is the largest whose need (the memory + 10 % "
    "and, on CUDA, the context) stays within the capacity, interpolated between the batches the line rests "
    "on or extrapolated beyond them. Its throughput there is measured where it ran at that batch, else "
    "forecast (95 % interval), else not known, with the reason."
)
CAPACITY = {"memory_budget_gib": "the study's memory_budget_gib", "device memory": "the device's memory"}


def group_label(row, keys: list[str]) -> str:
    """'synthetic/lenet, precision bf16': the keys of a workload up to its batch that the study varies."""
    named = [k for k in keys if k in GROUP_KEYS and k not in ("dataset", "model")]
    return f"{dataset_model(row)}{extra_keys(row, named)}"


def capacity_text(row) -> str:
    """ "70 GiB per device (the study's memory_budget_gib)" """
    return f"{row['capacity_mb'] / GIB:.3g} GiB per device ({CAPACITY.get(row['capacity_source'], '')})"


def source_text(row) -> str:
    """measured, forecast, or why there is no throughput (or no largest batch)."""
    return text(row["source"]) if row["source"] in ("measured", "forecast") else text(row["reason"])


def batch_table(rows: pd.DataFrame, keys: list[str]) -> str:
    table = pd.DataFrame(
        {
            "strategy": [strategy_label(r, keys) for _, r in rows.iterrows()],
            "largest per-device batch": [
                "n/a" if pd.isna(r["largest_batch"]) else f"{whole(r['largest_batch'])} ({text(r['how'])})"
                for _, r in rows.iterrows()
            ],
            "samples/s [95 %]": [
                "n/a"
                if pd.isna(r["samples_per_s"])
                else stats.interval_text(stats.value(r, "samples_per_s"), significant)
                for _, r in rows.iterrows()
            ],
            **work_columns(rows),
            "measured or forecast": [source_text(r) for _, r in rows.iterrows()],
        }
    )
    return markdown_table(table, escape=False)


def fastest_text(rows: pd.DataFrame, keys: list[str]) -> str:
    """Which strategy is fastest at its largest batch, and whether its interval clears the next's."""
    placed = rows.dropna(subset=["rank"]).sort_values("rank")
    if placed.empty:
        return "No strategy has a throughput at its largest batch."
    best = placed.iloc[0]
    throughput = stats.interval_text(stats.value(best, "samples_per_s"), significant, " samples/s")
    head = (
        f"Fastest there: **{strategy_label(best, keys)}** at per-device batch {whole(best['largest_batch'])}, "
        f"{throughput} ({text(best['source'])})"
    )
    if len(placed) == 1:
        return f"{head}, the only strategy with a throughput there."
    runner_up = strategy_label(placed.iloc[1], keys)
    if best["lead_claim"] == 1:
        return f"{head}; its interval clears that of the next, {runner_up}."
    return f"{head}; its interval overlaps that of the next, {runner_up}: no clear lead."


def at_largest_batch(tables: Tables) -> str:
    """Per workload up to its batch: each strategy at its largest per-device batch with its
    throughput there, and the fastest; "" where the study has no such table or no strategy."""
    table = tables.get("largest_batch")
    if table is None or table.empty:
        return ""
    if table["largest_batch"].isna().all():
        reasons = "; ".join(text(r) for r in table["reason"].dropna().unique()[:3])
        return f"*At the largest batch that fits:* no strategy has one here ({reasons})."
    keys = varied(tables)
    sections = [INTRO]
    groups = sorted(table["group"].unique())
    for group in groups[:LIST_LIMIT]:
        rows = table[table["group"] == group]
        first = rows.dropna(subset=["capacity_mb"])
        room = f", within {capacity_text(first.iloc[0])}" if not first.empty else ""
        sections += [
            f"**{group_label(rows.iloc[0], keys)}** at the largest batch that fits{room}:",
            batch_table(rows, keys),
            fastest_text(rows, keys),
        ]
    more = len(groups) - LIST_LIMIT
    if more > 0:
        sections.append(more_in(more, table_csv("largest_batch"), "workload"))
    return "\n\n".join(sections)
