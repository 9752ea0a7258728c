"""How throughput scales: throughput against the global batch, speedup and efficiency against the
devices, and the step model's speedup against the measured one (why not n times)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
import seaborn as sns

from dpstudy.report.figures.grids import settings_grid, versus_batch
from dpstudy.report.figures.layout import (
    LABELS,
    MAX_STYLES,
    Tables,
    axis_labels,
    figure,
    finish,
    hue,
    labelled,
    message,
    settings_of,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@figure
def throughput(tables: Tables) -> Figure:
    cells = labelled(tables["cells"])
    title = "Throughput vs global batch, by mode and device count"
    settings = settings_of(tables).dropna(subset=["samples_per_s"])
    if settings.empty:
        return message("No cell finished: there is no throughput to show.", title, cells)
    return finish(versus_batch(settings, "samples_per_s"), title, cells)


def metric_rows(settings: pd.DataFrame, metrics: tuple[str, ...]) -> pd.DataFrame:
    """Long form: a row per setting and metric with `value`, `value_low`, `value_high`."""
    return pd.concat(
        [
            settings.assign(
                metric=m, value=settings[m], value_low=settings[f"{m}_low"], value_high=settings[f"{m}_high"]
            )
            for m in metrics
        ],
        ignore_index=True,
    )


@figure
def scaling(tables: Tables) -> Figure:
    """The settings table's speedup and efficiency per setting with their intervals, against devices;
    every line starts at the single-device point (1 device, speedup 1)."""
    cells = labelled(tables["cells"])
    title = "Speedup and efficiency vs one device (grey dotted: ideal)"
    multi = settings_of(tables).dropna(subset=["speedup"]).query("devices > 1")
    if multi.empty:
        return message("No multi-device cell finished with a baseline: no speedup to show.", title, cells)
    style = "batch" if multi["batch"].nunique() <= MAX_STYLES else None
    lines = ["variant", "dataset_model", *([style] if style else [])]
    origins = multi[lines].drop_duplicates().assign(devices=1, speedup=1.0, efficiency=1.0)
    for part in ("_low", "_high"):
        origins = origins.assign(**{f"speedup{part}": float("nan"), f"efficiency{part}": float("nan")})
    long = metric_rows(pd.concat([multi, origins], ignore_index=True), ("speedup", "efficiency"))
    rows = {"row": "dataset_model"} if long["dataset_model"].nunique() > 1 else {}
    g = settings_grid(long, "devices", "value", style=style, col="metric", sharey=False, **rows)
    axis_labels(g, "devices", "metric")
    devices = sorted(long["devices"].unique())
    for key, ax in g.axes_dict.items():
        metric = key[-1] if isinstance(key, tuple) else key
        ax.set_ylabel(LABELS[metric])
        ax.set_xticks(devices)
        if metric == "speedup":
            ax.plot([1, max(devices)], [1, max(devices)], ls=":", color="0.4")
        else:
            ax.axhline(1.0, ls=":", color="0.4")
    return finish(g, title, cells)


@figure
def model(tables: Tables) -> Figure:
    """The step model's (dpstudy.analysis.scaling) vs measured speedup, one point per setting with the measured
    speedup's 95 % interval as a vertical bar; the diagonal is a perfect model, the dotted lines the
    ideal n x."""
    cells = labelled(tables["cells"])
    title = "Why not n times: the model's speedup vs the measured one"
    table = tables["scaling_settings"]  # measured: the settings' speedup with its interval
    table = table[table["predicted_speedup"].notna()]  # a setting the model could not calibrate
    if table.empty:
        return message("No multi-device cell finished with a baseline and a model: nothing to model.", title, cells)
    table = labelled(table).assign(loss=table["largest"].str.split(" [(]").str[0])
    colours = hue(table)
    g = sns.relplot(
        table,
        x="predicted_speedup",
        y="measured_speedup",
        style="loss",
        size="devices",
        sizes=(40, 160),
        height=4,
        aspect=1.2,
        **colours,
    )
    top = max(table["predicted_speedup"].max(), table["measured_speedup"].max(), table["devices"].max()) * 1.1
    top = max(top, table["measured_speedup_high"].max() * 1.05)  # NaN bounds (one run) leave it
    for ax in g.axes.flat:
        ax.plot([0, top], [0, top], ls="-", color="0.6", lw=0.8)
        for n in sorted(table["devices"].unique()):
            ax.axhline(n, ls=":", color="0.4", lw=0.8)
        interval_lines(ax, table, colours["palette"])
        ax.set_xlim(0, top)
        ax.set_ylim(0, top)
    axis_labels(g, "predicted_speedup", "measured_speedup")
    return finish(g, title, cells)


def interval_lines(ax, table: pd.DataFrame, palette: dict) -> None:
    """The measured speedup's [low, high] of every setting as one line per mode (NaN gaps between
    the bars; none where the bounds are NaN)."""
    import numpy as np

    for variant, rows in table.groupby("variant"):
        xs = np.repeat(rows["predicted_speedup"].to_numpy(dtype=float), 3)
        ys = (
            np.column_stack([rows["measured_speedup_low"], rows["measured_speedup_high"], np.full(len(rows), np.nan)])
            .astype(float)
            .ravel()
        )
        xs[2::3] = np.nan
        ax.plot(xs, ys, color=palette[variant], lw=1.0, alpha=0.8)
