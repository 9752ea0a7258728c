"""Which strategy: each finished strategy's throughput against the memory its fullest device needed,
the fastest of a workload ringed."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
import seaborn as sns

from dpstudy.report.figures.grids import settings_legend
from dpstudy.report.figures.layout import LABELS, Tables, figure, finish, hue, labelled, message

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@figure
def strategies(tables: Tables) -> Figure:
    """Which strategy: each finished strategy's throughput (its 95 % interval as a bar) against the
    memory its fullest device needed for one training step, a panel per workload and global batch;
    a ring marks each panel's fastest. Numbers from the strategies table (dpstudy.analysis.strategies)."""
    cells = labelled(tables["cells"])
    title = "Which strategy: throughput vs memory per device"
    table = tables["strategies"]
    ran = table[table["rank"].notna() & table["memory_mb"].notna()]
    if ran.empty:
        return message("No strategy finished with a measured memory split: nothing to place.", title, cells)
    ran = labelled(ran).assign(compiled=ran["compile"].astype(bool).map({True: "compiled", False: "eager"}))
    ran = ran.assign(global_batch=ran["global_batch"].map(lambda b: f"global batch {int(b)}"))
    facets = {"col": "global_batch"} | ({"row": "dataset_model"} if ran["dataset_model"].nunique() > 1 else {})
    markers = {"eager": "o", "compiled": "s"}
    g = sns.FacetGrid(ran, **hue(ran), height=3.5, aspect=1.3, sharex=False, sharey=False, **facets)
    g.map_dataframe(draw_strategies, markers=markers)
    for ax in g.axes.flat:  # once every strategy is drawn (a limit set earlier stops autoscaling)
        ax.set_xlim(0, ax.get_xlim()[1] * 1.08)  # room for the ring at the right edge
        ax.set_yscale("log")  # intervals are symmetric in log throughput (dpstudy.analysis.stats)
        plain_log_ticks(ax.yaxis)
    settings_legend(g, ran, "compiled", {k: v for k, v in markers.items() if k in set(ran["compiled"])}, [])
    g.set_axis_labels(LABELS["memory_mb"], LABELS["samples_per_s"])
    return finish(g, title + " (ring: the fastest)", cells)


def plain_log_ticks(axis) -> None:
    """A log axis labelled as numbers people read (30, 60, 100, 200), not as powers of ten."""
    from matplotlib import ticker

    from dpstudy.report.text import significant

    axis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: significant(v, 2)))
    axis.set_minor_formatter(ticker.NullFormatter())


def draw_strategies(data: pd.DataFrame, markers: dict, color=None, label=None, **_) -> None:
    """FacetGrid.map_dataframe: a marker per strategy with its throughput interval, a ring round rank 1."""
    import matplotlib.pyplot as plt

    ax = plt.gca()
    for compiled, rows in data.groupby("compiled"):
        below = (rows["samples_per_s"] - rows["samples_per_s_low"]).clip(lower=0).to_numpy(dtype=float)
        above = (rows["samples_per_s_high"] - rows["samples_per_s"]).clip(lower=0).to_numpy(dtype=float)
        ax.errorbar(
            rows["memory_mb"],
            rows["samples_per_s"],
            yerr=[below, above],
            fmt=markers[compiled],
            ls="none",
            color=color,
            ms=7,
            elinewidth=0.8,
            capsize=2,
        )
    best = data[data["rank"] == 1]
    ax.scatter(best["memory_mb"], best["samples_per_s"], s=260, facecolors="none", edgecolors="0.2", lw=1.2)
