"""What would N give: speedup and memory per device against device count per workload, the measured
DDP and FSDP settings (speedup with its 95 % interval) beside the forecasts (the forecasts table) with
their prediction intervals; forecasts hollow on a dashed line, extrapolated ones with dotted bars;
the leave-one-out forecasts of measured settings as crosses beside them, so the model's error on
this study is seen where it was checked."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from dpstudy.analysis.memory_forecast import held_memory
from dpstudy.report.figures.layout import MARKERS, Tables, figure, finish, labelled, message, settings_of
from dpstudy.report.text import significant
from dpstudy.study import modes
from dpstudy.study.budget import FRAGMENTATION

if TYPE_CHECKING:
    from matplotlib.figure import Figure

KINDS = ("measured", "leave-one-out", "forecast", "forecast, extrapolated")
# the figure's rows: (value, low, high) columns of points() and the axis label
METRICS = {
    "speedup": (("speedup", "low", "high"), "speedup vs one device"),
    "memory": (("memory", "memory_low", "memory_high"), "MB per device (step's peak; CUDA: allocated)"),
}
POINT_COLUMNS = ["dataset_model", "variant", "global_batch", "devices", "kind"]
POINT_COLUMNS += [c for columns, _ in METRICS.values() for c in columns]


def points(tables: Tables) -> pd.DataFrame:
    """A row per point: workload, variant, global_batch, devices, speedup with low and high, kind
    (KINDS). Measured: the settings table's DDP settings (and 1 device at speedup 1); forecasts:
    the forecasts table's, their speedup interval the throughput interval's ratios."""
    table = tables["forecasts"]
    table = table[table["how"] != "not forecast"].dropna(subset=["predicted_samples_per_s"])
    if table.empty:
        return pd.DataFrame(
            columns=["dataset_model", "variant", "global_batch", "devices", "speedup", "low", "high", "kind"]
        )
    # one node (the model forecasts no other); a table from before FSDP was forecast has no shard
    shard = table["shard"].astype(object).where(table["shard"].notna(), "none") if "shard" in table else "none"
    table = labelled(table.assign(nodes=1, shard=shard))
    ratio = table["predicted_speedup"] / table["predicted_samples_per_s"]
    kind = np.where(
        table["source"] == "leave-one-out",
        "leave-one-out",
        np.where(table["how"] == "extrapolated", "forecast, extrapolated", "forecast"),
    )
    made = pd.DataFrame(
        {
            "dataset_model": table["dataset_model"],
            "variant": table["variant"],
            "global_batch": table["global_batch"].astype(int),
            "devices": table["devices"].astype(int),
            "speedup": table["predicted_speedup"],
            "low": table["predicted_low"] * ratio,
            "high": table["predicted_high"] * ratio,
            "memory": table["predicted_memory_mb"],
            "memory_low": table["predicted_memory_low"],
            "memory_high": table["predicted_memory_high"],
            "kind": kind,
        }
    )
    settings = settings_of(tables)
    settings = settings.assign(memory=held_memory(settings, tables.get("memory_split")))
    ddp = settings[
        settings["mode"].isin(modes.forecast_modes()) & settings["dataset_model"].isin(made["dataset_model"])
    ]
    measured = pd.DataFrame(
        {
            "dataset_model": ddp["dataset_model"],
            "variant": ddp["variant"],
            "global_batch": ddp["global_batch"].astype(int),
            "devices": ddp["devices"].astype(int),
            "speedup": ddp["speedup"],
            "low": ddp["speedup_low"],
            "high": ddp["speedup_high"],
            "memory": ddp["memory"],
            "kind": "measured",
        }
    )
    lines = pd.concat([measured, made])[["dataset_model", "variant", "global_batch"]].drop_duplicates()
    single = settings[settings["mode"] == modes.BASELINE].set_index(["dataset_model", "global_batch"])["memory"]
    single = single[~single.index.duplicated()]
    origins = lines.assign(devices=1, speedup=1.0, kind="measured")
    origins["memory"] = single.reindex(pd.MultiIndex.from_frame(lines[["dataset_model", "global_batch"]])).to_numpy()
    return pd.concat([origins, measured, made], ignore_index=True).reindex(columns=POINT_COLUMNS)


@figure
def forecasts(tables: Tables) -> Figure:
    import matplotlib.pyplot as plt
    import seaborn as sns

    cells = labelled(tables["cells"])
    title = "What would N give? Speedup vs devices: measured, held out and forecast"
    data = points(tables)
    if data.empty:
        return message("No forecast: the study has no DDP settings to calibrate on (see the report).", title, cells)
    workloads = sorted(data["dataset_model"].unique())
    rows = [m for m in METRICS if data[METRICS[m][0][0]].notna().any()]
    size = (5.2 * len(workloads), 3.8 * len(rows))
    fig, axes = plt.subplots(len(rows), len(workloads), figsize=size, squeeze=False, sharex="col")
    variants = sorted(data["variant"].unique())
    colours = dict(zip(variants, sns.color_palette("colorblind", len(variants)), strict=True))
    batches = sorted(data["global_batch"].unique())
    markers = {b: MARKERS[i % len(MARKERS)] for i, b in enumerate(batches)}
    for column, name in enumerate(workloads):
        for row, metric in enumerate(rows):
            draw_workload(axes[row, column], data[data["dataset_model"] == name], metric, colours, markers)
        ax = axes[0, column]
        held = tables["forecasts"]
        held = held[(held["source"] == "leave-one-out") & (held["dataset"] + "/" + held["model"] == name)]
        error = "not checked on a held-out setting"
        if len(held):
            error = f"leave-one-out median |error|: throughput {held['error'].abs().median() * 100:.1f} %"
            if held["memory_error"].notna().any():
                error += f", memory {held['memory_error'].abs().median() * 100:.1f} %"
        ax.set_title(f"{name}\n{error}", fontsize=9)
        if "memory" in rows:
            capacity_line(axes[rows.index("memory"), column], held_of(tables["forecasts"], name))
    legend(fig, colours, markers)
    return finish(fig, title, cells)


def draw_workload(ax, data: pd.DataFrame, metric: str, colours: dict, markers: dict) -> None:
    """One workload's `metric` (METRICS): per (variant, batch) a solid line through the measured
    points and a dashed one on to the forecasts; every point with its interval; for the speedup the
    ideal n x dotted."""
    from matplotlib import ticker

    (value, low, high), label = METRICS[metric]
    data = data.dropna(subset=[value])
    for (variant, batch), rows in data.groupby(["variant", "global_batch"]):
        colour, marker = colours[variant], markers[batch]
        measured = rows[rows["kind"] == "measured"].sort_values("devices")
        ahead = rows[rows["kind"].str.startswith("forecast")].sort_values("devices")
        ax.plot(measured["devices"], measured[value], color=colour, lw=1.5)
        if not ahead.empty:
            start = measured.tail(1)
            ax.plot([*start["devices"], *ahead["devices"]], [*start[value], *ahead[value]], color=colour, ls="--")
        for kind, face, style in (
            ("measured", colour, "-"),
            ("forecast", "white", "-"),
            ("forecast, extrapolated", "white", ":"),
            ("leave-one-out", colour, "-"),
        ):
            part = rows[rows["kind"] == kind]
            if part.empty:
                continue
            below = (part[value] - part[low]).clip(lower=0).to_numpy(dtype=float)
            above = (part[high] - part[value]).clip(lower=0).to_numpy(dtype=float)
            shown = ax.errorbar(
                part["devices"] * (1.06 if kind == "leave-one-out" else 1.0),  # beside the measured point
                part[value],
                yerr=[below, above],
                fmt="x" if kind == "leave-one-out" else marker,
                mfc=face,
                mec=colour,
                color=colour,
                ms=6,
                elinewidth=0.9,
                capsize=2,
            )
            for bar in shown[2]:
                bar.set_linestyle(style)
    devices = sorted(data["devices"].unique())
    if metric == "speedup":
        ax.plot([1, max(devices)], [1, max(devices)], ls=":", color="0.4", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(ticker.FixedLocator(devices))
    ax.xaxis.set_minor_locator(ticker.NullLocator())
    ax.xaxis.set_major_formatter(ticker.ScalarFormatter())
    ax.set_xlabel("devices")
    ax.set_ylabel(label)


def held_of(forecasts: pd.DataFrame, workload: str) -> pd.DataFrame:
    return forecasts[forecasts["dataset"] + "/" + forecasts["model"] == workload]


def capacity_line(ax, rows: pd.DataFrame) -> None:
    """The largest memory per device that fits (dpstudy.analysis.capacity: the capacity less the
    context, over 1 + the fragmentation margin) as a line on the memory axis: a point above it does
    not fit. Nothing where no capacity is known."""
    known = rows.dropna(subset=["capacity_mb", "need_mb", "predicted_memory_mb"]) if "fits" in rows else rows.iloc[:0]
    if known.empty:
        return
    row = known.iloc[0]
    context = row["need_mb"] - row["predicted_memory_mb"] * (1 + FRAGMENTATION)
    limit = (row["capacity_mb"] - context) / (1 + FRAGMENTATION)
    told = f"fits below {significant(limit)} MB ({row['capacity_mb'] / 1024:.3g} GiB per device)"
    if limit > 3 * ax.get_ylim()[1]:  # far above every point: said, not drawn, so the points stay legible
        ax.text(0.02, 0.97, told + ": every point fits", transform=ax.transAxes, va="top", fontsize=7, color="0.35")
        return
    ax.axhline(limit, color="0.35", ls="-.", lw=0.9)
    ax.annotate(told, (0.02, limit), xycoords=("axes fraction", "data"), va="bottom", fontsize=7, color="0.35")


def legend(fig, colours: dict, markers: dict) -> None:
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=c, lw=1.5, label=v) for v, c in colours.items()]
    handles += [Line2D([], [], color="0.3", marker=m, ls="none", label=f"batch {b}") for b, m in markers.items()]
    handles += [
        Line2D([], [], color="0.3", marker="o", label="measured (bar: 95 % interval)"),
        Line2D([], [], color="0.3", marker="x", ls="none", label="measured setting forecast without it"),
        Line2D([], [], color="0.3", marker="o", mfc="white", ls="--", label="forecast (bar: 95 % prediction)"),
        Line2D([], [], color="0.3", marker="o", mfc="white", ls="--", label="forecast, extrapolated (dotted bar)"),
        Line2D([], [], color="0.4", ls=":", lw=0.8, label="ideal n x"),
    ]
    fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
    fig.tight_layout()
