"""The overview figure: heat maps of the settings' median speedup, efficiency and final accuracy over
the two setting keys with the most values."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
import seaborn as sns

from dpstudy.report.figures.grids import hidden_keys
from dpstudy.report.figures.layout import Tables, figure, finish, folded_note, hue, labelled, message, settings_of

if TYPE_CHECKING:
    from matplotlib.figure import Figure

HEAT_METRICS = {
    "speedup": ("speedup", lambda v: f"{v:.2f}"),
    "efficiency": ("efficiency", lambda v: f"{v:.0%}"),
    "final_test_acc": ("final test accuracy", lambda v: f"{v * 100:.1f}"),
}


@figure
def overview(tables: Tables) -> Figure:
    """Heat maps of the median speedup, efficiency and final accuracy over the two setting keys with
    the most values (dpstudy.report.overview.axis_keys), a row per mode; with fewer keys, the modes on
    the y axis. Other varied keys are folded into the median."""
    from dpstudy.report.overview import VARIANT_KEYS, axis_keys

    cells = labelled(tables["cells"])
    title = "Overview: median speedup, efficiency and final test accuracy of the settings"
    settings = settings_of(tables)
    if settings.empty:
        return message("No setting finished: there is nothing to map.", title, cells)
    keys = axis_keys(settings, exclude=VARIANT_KEYS)
    x, y = (keys + [None, None])[:2]
    if y is None:
        y, rows = "variant", [None]
    else:
        rows = [v for v in hue(settings)["hue_order"]]
    fig = heat_maps(settings, x, y, rows)
    return finish(fig, title + folded_note(hidden_keys(settings, ["variant", *filter(None, (x, y))])), cells)


def heat_maps(settings: pd.DataFrame, x: str | None, y: str, rows: list) -> Figure:
    """A heat map per mode (row; None: every mode, on the y axis) and metric (column), median over
    the settings of a square, one colour scale per metric; values written in when few squares."""
    import matplotlib.pyplot as plt

    data = settings.assign(_all="all")
    x = x or "_all"
    nx, ny = data[x].nunique(), data[y].nunique()
    width, height = min(6.0, max(2.8, 1.6 + 0.16 * nx)), min(4.0, max(1.4, 0.9 + 0.22 * ny))
    fig, axes = plt.subplots(
        len(rows), len(HEAT_METRICS), figsize=(width * len(HEAT_METRICS), height * len(rows)), squeeze=False
    )
    for column, (metric, (name, fmt)) in enumerate(HEAT_METRICS.items()):
        values = data[metric].dropna()
        scale = {"vmin": values.min(), "vmax": values.max()} if not values.empty else {}
        for row, variant in enumerate(rows):
            part = data if variant is None else data[data["variant"] == variant]
            heat_map(axes[row][column], part, x, y, metric, fmt, scale, f"{variant + ': ' if variant else ''}{name}")
    fig.tight_layout()
    return fig


def heat_map(ax, data: pd.DataFrame, x: str, y: str, metric: str, fmt, scale: dict, title: str) -> None:
    """One panel: the median of `metric` per (y, x) square; a line of text where there is none."""
    grid = data.groupby([y, x], dropna=False)[metric].median().unstack(x)
    ax.set_title(title, fontsize=9)
    baseline = metric in ("speedup", "efficiency") and (data["devices"] <= 1).all()
    if baseline or grid.isna().all().all():
        ax.axis("off")
        ax.text(
            0.5,
            0.5,
            "one device: the baseline (1x)" if baseline else "nothing measured",
            ha="center",
            va="center",
            transform=ax.transAxes,
            fontsize=8,
        )
        return
    annotate = grid.size <= 60
    written = grid.map(lambda v: "" if pd.isna(v) else fmt(v)) if annotate else False
    sns.heatmap(
        grid,
        ax=ax,
        cmap="viridis",
        annot=written,
        fmt="",
        annot_kws={"fontsize": 7},
        cbar=True,
        linewidths=0.3 if annotate else 0,
        **scale,
    )
    ax.set_xlabel("" if x == "_all" else x)
    ax.set_ylabel("" if y == "variant" else y)
    ax.tick_params(labelsize=7)
