"""Memory: each rank's peak in the last epoch, and one training step's peak per device split into its
parts beside the memory plan's prediction."""

from __future__ import annotations

from typing import TYPE_CHECKING

import seaborn as sns

from dpstudy.report.figures.bars import bar_groups, bar_size
from dpstudy.report.figures.layout import (
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
def memory(tables: Tables) -> Figure:
    cells = labelled(tables["cells"])
    devices = " and ".join(sorted(cells["env_device"].dropna().unique())) or "unknown device"
    title = f"Peak memory per rank, last epoch (ran on {devices}; GPU: peak allocated, CPU: peak RSS)"
    ranks = tables["ranks"]
    last = with_settings(ranks[ranks["epoch"] == ranks.groupby("cell")["epoch"].transform("max")], cells)
    if last.empty:
        return message("No cell finished: there is no memory to show.", title, cells)
    labels, order, folded = bar_groups(last)
    last = last.assign(rank=last["rank"].map("rank {}".format), setting=labels)
    bars = last[["setting", "rank"]].drop_duplicates().shape[0]
    g = sns.catplot(
        last,
        x="peak_mem_mb",
        y="setting",
        order=order,
        hue="rank",
        kind="bar",
        orient="h",
        estimator="median",
        errorbar=None,
        **bar_size(bars),
    )
    axis_labels(g, "peak_mem_mb", "setting")
    return finish(g, title + folded_note(folded), cells)


@figure
def memory_split(tables: Tables) -> Figure:
    """One training step's peak per device split into parameters, gradients, optimizer state and
    activations (PyTorch's tracker), a bar per setting and device (median of the repeats), with the
    memory plan's prediction as a black tick."""
    cells = labelled(tables["cells"])
    title = "Memory per device: one training step, measured (bars) and predicted before training (|)"
    # `device` of the split is the device's index; the settings' `device` is the spec's request
    split = tables["memory_split"].dropna(subset=["peak_mb"]).rename(columns={"device": "index"})
    rows = with_settings(split, cells)
    if rows.empty:
        return message("No cell finished with a measured memory split.", title, cells)
    labels, order, folded = bar_groups(rows)
    index = rows["index"].astype(int)
    rows = rows.assign(setting=labels + "  dev " + index.astype(str))
    order = [f"{o}  dev {d}" for o in order for d in sorted(index[labels == o].unique())]
    parts = {
        "params_mb": "parameters",
        "grads_mb": "gradients",
        "optimizer_mb": "optimizer state",
        "activations_mb": "activations and temporaries",
    }
    per_bar = rows.groupby("setting")[[*parts, "predicted_peak_mb"]].median().reindex(order)
    long = per_bar[list(parts)].reset_index().melt(id_vars="setting", var_name="part", value_name="mb")
    long["part"] = long["part"].map(parts)
    g = sns.displot(
        long,
        y="setting",
        weights="mb",
        hue="part",
        hue_order=list(parts.values()),
        multiple="stack",
        discrete=True,
        shrink=0.8,
        **bar_size(len(order)),
    )
    predicted = per_bar["predicted_peak_mb"].dropna()
    if not predicted.empty:  # on the bars' own categorical axis
        g.axes.flat[0].scatter(predicted.to_numpy(), predicted.index, marker="|", s=250, color="black", lw=2, zorder=3)
    axis_labels(g, "mb", "setting")
    return finish(g, title + folded_note(folded), cells)
