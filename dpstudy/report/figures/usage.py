"""Where the time went: each epoch split into waiting for data and computing, and the GPUs'
utilisation over time."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
import seaborn as sns

from dpstudy.report.figures.bars import bar_groups, bar_size
from dpstudy.report.figures.layout import (
    MAX_PANELS,
    Tables,
    axis_labels,
    figure,
    finish,
    folded_note,
    labelled,
    message,
    with_settings,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@figure
def epoch_split(tables: Tables) -> Figure:
    cells = labelled(tables["cells"])
    title = "Each epoch: waiting for data vs computing"
    epochs = tables["epochs"][["cell", "warmup", "data_wait_s", "compute_s"]]
    steady = with_settings(epochs[~epochs["warmup"].astype(bool)], cells)
    if steady.empty:
        return message("No cell finished: there are no epochs to show.", title, cells)
    labels, order, folded = bar_groups(steady)
    per_bar = steady.assign(setting=labels).groupby("setting")[["data_wait_s", "compute_s"]].median()
    long = per_bar.reindex(order).reset_index().melt(id_vars="setting", var_name="part", value_name="seconds")
    long["part"] = long["part"].map({"data_wait_s": "waiting for data", "compute_s": "computing"})
    # a stacked histogram weighted by seconds draws one stacked bar per setting (median of repeats)
    g = sns.displot(
        long,
        y="setting",
        weights="seconds",
        hue="part",
        hue_order=["computing", "waiting for data"],
        multiple="stack",
        discrete=True,
        shrink=0.8,
        **bar_size(len(order)),
    )
    axis_labels(g, "seconds", "setting")
    return finish(g, title + folded_note(folded), cells)


def sampled_cells(util: pd.DataFrame, cells: pd.DataFrame, limit: int = MAX_PANELS) -> list[str]:
    """Every sampled cell when at most `limit`; else per mode the cell of median mean GPU use, then
    the lowest and the highest, until `limit`."""
    busy = util.groupby("cell")["gpu_util"].mean().rename("busy").reset_index()
    if len(busy) <= limit:
        return sorted(busy["cell"])
    busy = busy.merge(cells[["cell", "variant"]], on="cell", how="left").sort_values(["busy", "cell"])
    picks: list[str] = []
    for position in ("median", "lowest", "highest"):
        for _, group in busy.groupby("variant", dropna=False, sort=True):
            at = {"median": (len(group) - 1) // 2, "lowest": 0, "highest": len(group) - 1}[position]
            if len(picks) < limit and group["cell"].iloc[at] not in picks:
                picks.append(group["cell"].iloc[at])
    return sorted(picks)


@figure
def utilisation(tables: Tables) -> Figure:
    cells = labelled(tables["cells"])
    title = "GPU utilisation and memory bandwidth use over time"
    util = tables["util"]
    if util.empty:
        ran_on = ", ".join(sorted(cells["env_device"].dropna().unique())) or "no device"
        return message(f"No GPU utilisation was sampled in this study (cells ran on: {ran_on}).", title, cells)
    shown = sampled_cells(util, cells)
    if len(shown) < util["cell"].nunique():
        title += (
            f" - {len(shown)} of {util['cell'].nunique()} sampled cells (per mode: median, lowest, highest"
            " mean GPU use; util.csv has all)"
        )
    long = util[util["cell"].isin(shown)].melt(
        id_vars=["cell", "device", "t"], value_vars=["gpu_util", "mem_util"], var_name="metric", value_name="value"
    )
    long["metric"] = long["metric"].map({"gpu_util": "GPU busy", "mem_util": "memory busy"})
    long["device"] = long["device"].map("GPU {}".format)
    n = long["cell"].nunique()
    g = sns.relplot(
        long,
        x="t",
        y="value",
        hue="device",
        style="metric",
        col="cell",
        col_wrap=min(n, 3),
        kind="line",
        height=3,
        aspect=1.4,
    )
    axis_labels(g, "t", "value")
    return finish(g, title, cells)
