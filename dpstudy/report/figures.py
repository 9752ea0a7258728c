"""Figures from the tidy tables: one function per figure, each one seaborn grid.

Every function takes the tables of dpstudy.analysis.collect ({"cells", "epochs", "ranks", "util", "settings",
"scaling"}) and returns a matplotlib Figure. Speedup, efficiency, throughput and final accuracy are
the settings table's (a marker per setting, its 95 % interval as an error bar), never recomputed
here: a figure shows the numbers the report prints. Cells that did not finish (skipped, oom, failed)
are listed with their reason under every figure, so nothing disappears silently. FIGURES is the one
list of figure files: the Snakemake rule names its outputs from it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from dpstudy.report.text import not_run_lines as not_run_lines_of
from dpstudy.report.text import plural
from dpstudy.study import outputs
from dpstudy.util.atomic import atomic_output

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def lazy(name: str) -> ModuleType:
    """Import `name` on first use (importlib's LazyLoader recipe). The Snakefile reads FIGURES
    to name the figure rule's outputs, and must not pay for matplotlib and seaborn each time."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


os.environ.setdefault("MPLBACKEND", "Agg")  # files only, also on machines without a display
pd = lazy("pandas")
sns = lazy("seaborn")

Tables = dict[str, "pd.DataFrame"]
VARIANTS = (
    "single",
    "dp",
    "ddp/gloo",
    "ddp/nccl",
    "fsdp full/gloo",
    "fsdp full/nccl",
    "fsdp grad_op/gloo",
    "fsdp grad_op/nccl",
)
LABELS = {  # axis labels
    "global_batch": "global batch (samples per step)",
    "samples_per_s": "throughput (samples/s)",
    "devices": "devices",
    "speedup": "speedup vs one device",
    "efficiency": "scaling efficiency",
    "epoch": "epoch",
    "test_acc_pct": "test accuracy (%)",
    "final_test_acc_pct": "final test accuracy (%)",
    "seconds": "seconds per epoch (median of epochs >= 2)",
    "peak_mem_mb": "peak memory (MB)",
    "t": "seconds since start",
    "value": "percent",
    "cell": "",
    "setting": "",
    "metric": "",
    "predicted_speedup": "speedup the model predicts",
    "measured_speedup": "measured speedup",
    "memory_mb": "MB per device (step's peak, fullest)",
    "mb": "MB (one training step's peak, PyTorch's tracker)",
}
# Legend titles stay about as long as the column names: seaborn sized the legend for those.
LEGEND_TITLES = {
    "variant": "mode",
    "devices": "devices",
    "loss": "largest loss",
    "global_batch": "global batch",
    "part": "",
    "metric": "",
    "device": "GPU",
    "compiled": "torch.compile",
}
MAX_NOTE_LINES = 12
DPI = 110
# A study of thousands of cells still gets figures of about one screen each. Markers tell apart at
# most MAX_STYLES values of a key (more: its settings spread around their x, a line through their
# median); a bar chart has at most MAX_BARS bars (more settings: folded into medians, the figure
# says over which keys); per-cell lines and utilisation panels are capped the same way.
MAX_STYLES = 6
MAX_BARS = 30
MAX_LINES = 40
MAX_PANELS = 6
MAX_HEIGHT = 9.0  # inches, about one screen at DPI
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
SPREAD = 0.5  # width of the band a place's settings spread over: log2 units, or devices
# Keys that say how a cell ran (a colour of their own), never folded into a median of a bar chart;
# the batch keys are folded last.
CORE_KEYS = ("dataset", "model", "mode", "backend", "nodes", "gpus", "devices", "device", "env_device")
BATCH_KEYS = ("batch", "global_batch", "batch_scope")


def labelled(cells: pd.DataFrame) -> pd.DataFrame:
    """cells plus `variant` (mode, with fsdp's sharding, the backend of ddp and fsdp, and the nodes
    when several: inter-node scaling gets a colour of its own) and `workload` (dataset/model)."""
    strategy = cells["mode"].where(cells["shard"] == "none", cells["mode"] + " " + cells["shard"])
    variant = strategy.where(cells["backend"] == "none", strategy + "/" + cells["backend"])
    variant = variant.where(cells["nodes"] <= 1, variant + " on " + cells["nodes"].astype("string") + " nodes")
    return cells.assign(variant=variant, workload=cells["dataset"] + "/" + cells["model"])


def finished(cells: pd.DataFrame) -> pd.DataFrame:
    return cells[cells["status"] == "ok"]


def hue(data: pd.DataFrame) -> dict:
    """The same colour for a mode in every figure."""
    present = set(data["variant"])
    order = [v for v in VARIANTS if v in present] + sorted(present - set(VARIANTS))
    colours = sns.color_palette("colorblind", len(VARIANTS) + len(order))
    palette = {v: colours[VARIANTS.index(v) if v in VARIANTS else len(VARIANTS) + i] for i, v in enumerate(order)}
    return {"hue": "variant", "hue_order": order, "palette": palette}


def settings_of(tables: Tables) -> pd.DataFrame:
    """The settings table (dpstudy.analysis.stats.settings_table: a row per setting, its repeats combined
    with a 95 % interval) with variant and workload. Every speedup, efficiency, throughput and final
    accuracy a figure draws comes from there, so a figure shows the numbers the report prints."""
    return labelled(tables["settings"])


def hidden_keys(data: pd.DataFrame, shown: list[str]) -> list[str]:
    """The setting keys that tell apart settings drawn at one place (equal in every `shown` column)."""
    from dpstudy.analysis.keys import SETTING_KEYS

    keys = [k for k in SETTING_KEYS if k in data and k not in shown]
    if data.empty or not keys:
        return []
    counts = data.groupby(shown, dropna=False)[keys].nunique(dropna=False).max()
    return [k for k in keys if counts[k] > 1]


def spread(data: pd.DataFrame, x: str, shown: list[str], hidden: list[str], log: bool) -> pd.Series:
    """Each setting's x, moved within a band SPREAD wide when settings share a place, in the order of
    the hidden keys: dozens of learning rates at one batch read as a strip, not as one blot."""
    if not hidden:
        return data[x].astype(float)
    ordered = data.sort_values(hidden, kind="stable").groupby(shown, dropna=False)
    rank = ordered.cumcount().reindex(data.index)
    size = ordered[x].transform("size").reindex(data.index)
    offset = ((rank + 0.5) / size - 0.5) * SPREAD
    return data[x].astype(float) * 2.0**offset if log else data[x].astype(float) + offset


def draw_settings(
    data: pd.DataFrame,
    x: str,
    y: str,
    style: str | None = None,
    markers: dict | None = None,
    crowded: bool = False,
    color=None,
    label=None,
    **_,
) -> None:
    """FacetGrid.map_dataframe: a marker per setting at (its spread x, y) with its [low, high] as an
    error bar (none where the bounds are NaN), and per style value a line through the median of the
    settings at each x (the setting itself when it is alone there)."""
    import matplotlib.pyplot as plt

    ax = plt.gca()
    for value, rows in data.groupby(style, sort=True) if style else [(None, data)]:
        marker = markers[value] if style else "o"
        line = rows.groupby(x)[y].median()
        ax.plot(line.index, line.to_numpy(), color=color, lw=1.5, label=label)
        below = (rows[y] - rows[f"{y}_low"]).clip(lower=0).to_numpy(dtype=float)
        above = (rows[f"{y}_high"] - rows[y]).clip(lower=0).to_numpy(dtype=float)
        ax.errorbar(
            rows["_x"],
            rows[y],
            yerr=[below, above],
            fmt=marker,
            ls="none",
            color=color,
            ms=3.5 if crowded else 6,
            alpha=0.6 if crowded else 1.0,
            elinewidth=0.8,
            capsize=0 if crowded else 2,
        )
        label = None


def settings_legend(
    g: sns.FacetGrid, data: pd.DataFrame, style: str | None, markers: dict | None, hidden: list[str]
) -> None:
    """Colours (modes), then markers (the style key's values), then what the lines are."""
    from matplotlib.lines import Line2D

    colours = hue(data)
    handles = {v: Line2D([], [], color=colours["palette"][v], marker="o", lw=1.5) for v in colours["hue_order"]}
    blank = Line2D([], [], ls="none")
    if style:
        handles[style] = blank
        handles.update({str(v): Line2D([], [], color="0.3", marker=m, ls="none") for v, m in markers.items()})
    handles["marker: a setting, bar: 95 % interval"] = blank
    if hidden:
        handles[f"line: median over {', '.join(hidden)}"] = blank
    g.add_legend(legend_data=handles, label_order=list(handles), title="variant")


def settings_grid(
    data: pd.DataFrame, x: str, y: str, style: str | None = None, log: bool = False, **facets
) -> sns.FacetGrid:
    """Settings (rows of the settings table, with y, y_low, y_high) against x: a colour per mode, a
    marker per `style` value when there are at most MAX_STYLES, facets as given."""
    if style and data[style].nunique() > MAX_STYLES:
        style = None
    shown = [x, "variant", *(facets[k] for k in ("col", "row") if k in facets), *([style] if style else [])]
    hidden = hidden_keys(data, shown)
    data = data.reset_index(drop=True)
    data = data.assign(_x=spread(data, x, shown, hidden, log))
    markers = (
        {v: MARKERS[i % len(MARKERS)] for i, v in enumerate(sorted(data[style].dropna().unique()))} if style else None
    )
    g = sns.FacetGrid(data, **hue(data), height=3.5, aspect=1.3, **facets)
    g.map_dataframe(draw_settings, x=x, y=y, style=style, markers=markers, crowded=bool(hidden))
    settings_legend(g, data, style, markers, hidden)
    return g


def workload_facets(data: pd.DataFrame) -> dict:
    n = data["workload"].nunique()
    return {"col": "workload", "col_wrap": min(n, 3)} if n > 1 else {}


def setting_of(cells: pd.Series) -> pd.Series:
    """A cell's setting: its id without the repeat suffix (-r2); repeats share one bar or line."""
    return cells.str.replace(r"-r\d+$", "", regex=True)


def not_run_lines(cells: pd.DataFrame) -> list[str]:
    """One line per reason, naming a few of its settings (see cells.csv for all)."""
    rest = cells[cells["status"] != "ok"].sort_values("cell")
    rest = rest.assign(setting=setting_of(rest["cell"]))
    lines = not_run_lines_of(rest, "cell", lambda r: r.setting, shown=3, markdown=False)  # plain text for matplotlib
    if len(lines) > MAX_NOTE_LINES:
        lines = lines[: MAX_NOTE_LINES - 1] + [
            f"... and {len(lines) - MAX_NOTE_LINES + 1} more reasons (see cells.csv)"
        ]
    return lines


def finish(fig_or_grid: Figure | sns.FacetGrid, title: str, cells: pd.DataFrame) -> Figure:
    """Facet and legend titles made readable; the cells that did not finish listed below the figure."""
    fig = fig_or_grid
    if isinstance(fig_or_grid, sns.FacetGrid):
        fig = fig_or_grid.figure
        fig_or_grid.set_titles(row_template="{row_name}", col_template="{col_name}", size=9)
        legend = fig_or_grid.legend
        for text in [legend.get_title(), *legend.texts] if legend else []:
            text.set_text(LEGEND_TITLES.get(text.get_text(), text.get_text()))
        fig_or_grid.tight_layout()  # again: the labels changed after seaborn laid the grid out
    fig.suptitle(title, y=1.02)
    lines = not_run_lines(cells)
    if lines:
        # below the axes: savefig(bbox_inches="tight") grows the image to include it
        fig.text(
            0.01,
            -0.01,
            "Not shown (did not finish):\n" + "\n".join(lines),
            ha="left",
            va="top",
            fontsize=7,
            family="monospace",
            parse_math=False,
        )  # a reason's $ is a $
    return fig


def message(text: str, title: str, cells: pd.DataFrame) -> Figure:
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(7, 1.5))
    fig.text(0.5, 0.5, text, ha="center", va="center", wrap=True, parse_math=False)
    return finish(fig, title, cells)


def bar_size(bars: int) -> dict:
    """Height grows with the number of bars up to about a screen; width stays readable for long cell ids."""
    height = min(MAX_HEIGHT, max(2.5, 1.0 + 0.3 * bars))
    return {"height": height, "aspect": 8.0 / height}


def short(key: str, value) -> str:
    """A key's value in a bar's label: 'ddp', 'g4', 'b256', 'lr 0.05'; '' for backend none."""
    if pd.isna(value):
        return f"{key} ?"
    if key in ("dataset", "model", "mode"):
        return str(value)
    if key == "backend":
        return "" if value == "none" else str(value)
    if key in ("gpus", "batch"):
        return f"{key[0]}{value}"
    return f"{key} {value:g}" if isinstance(value, float) else f"{key} {value}"


def fold_keys(rows: pd.DataFrame, limit: int) -> tuple[list[str], list[str]]:
    """(kept, folded) varied setting keys, folding the keys with most values first (the batch keys
    last, CORE_KEYS never) until the kept keys make at most `limit` groups."""
    from dpstudy.analysis.stats import varied_keys

    kept = varied_keys(rows)
    folded: list[str] = []

    def groups() -> int:
        return rows[kept].drop_duplicates().shape[0] if kept else 1

    others = sorted((k for k in kept if k not in CORE_KEYS + BATCH_KEYS), key=lambda k: -rows[k].nunique(dropna=False))
    for key in others:
        if groups() <= limit:
            break
        kept.remove(key)
        folded.append(key)
    if groups() > limit:
        folded += [k for k in kept if k in BATCH_KEYS]
        kept = [k for k in kept if k not in BATCH_KEYS]
    return kept, folded


def bar_groups(rows: pd.DataFrame, limit: int = MAX_BARS) -> tuple[pd.Series, list[str], list[str]]:
    """(a bar label per row, the labels in order, the keys folded away) for rows that carry `cell`
    and the setting keys: a bar per setting (its id without the repeat) while there are at most
    `limit` settings; beyond, a bar per group of settings that differ only in the folded keys."""
    settings = setting_of(rows["cell"])
    if settings.nunique() <= limit:
        return settings, sorted(settings.unique()), []
    kept, folded = fold_keys(rows, limit)
    named = [k for k in kept if k not in ("devices", "global_batch", "env_device")] or kept
    combos = rows[kept].drop_duplicates().sort_values(kept, ignore_index=True)
    names = (
        [
            " ".join(filter(None, (short(k, v) for k, v in zip(named, values))))
            for values in combos[named].itertuples(index=False)
        ]
        if named
        else ["all settings"] * len(combos)
    )
    labels = (
        rows[kept].merge(combos.assign(_label=names), on=kept, how="left")["_label"]
        if kept
        else (pd.Series("all settings", index=range(len(rows))))
    )
    return pd.Series(labels.to_numpy(), index=rows.index), list(dict.fromkeys(names)), folded


def folded_note(folded: list[str]) -> str:
    return f" (medians over settings that differ in {', '.join(folded)})" if folded else ""


def label(grid: sns.FacetGrid, x: str, y: str) -> None:
    grid.set_axis_labels(LABELS[x], LABELS[y])


def log2_axis(grid: sns.FacetGrid, values: pd.Series) -> None:
    """Batch sizes are powers of two: log2 axis ticked at the values that ran."""
    from matplotlib import ticker

    ticks = sorted(values.dropna().unique())
    for ax in grid.axes.flat:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(ticker.FixedLocator(ticks))
        ax.xaxis.set_minor_locator(ticker.NullLocator())
        ax.xaxis.set_major_formatter(ticker.ScalarFormatter())
        if len(ticks) > 6:  # 8 .. 4096 side by side overlap
            ax.tick_params(axis="x", labelrotation=45)


def versus_batch(settings: pd.DataFrame, y: str) -> sns.FacetGrid:
    """y of each setting against the global batch (log2 axis), a line per mode and device count."""
    g = settings_grid(settings, "global_batch", y, style="devices", log=True, **workload_facets(settings))
    label(g, "global_batch", y)
    log2_axis(g, settings["global_batch"])
    return g


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


def scaling(tables: Tables) -> Figure:
    """The settings table's speedup and efficiency per setting with their intervals, against devices;
    every line starts at the single-device point (1 device, speedup 1)."""
    cells = labelled(tables["cells"])
    title = "Speedup and efficiency vs one device (grey dotted: ideal)"
    multi = settings_of(tables).dropna(subset=["speedup"]).query("devices > 1")
    if multi.empty:
        return message("No multi-device cell finished with a baseline: no speedup to show.", title, cells)
    style = "batch" if multi["batch"].nunique() <= MAX_STYLES else None
    lines = ["variant", "workload", *([style] if style else [])]
    origins = multi[lines].drop_duplicates().assign(devices=1, speedup=1.0, efficiency=1.0)
    for part in ("_low", "_high"):
        origins = origins.assign(**{f"speedup{part}": float("nan"), f"efficiency{part}": float("nan")})
    long = metric_rows(pd.concat([multi, origins], ignore_index=True), ("speedup", "efficiency"))
    rows = {"row": "workload"} if long["workload"].nunique() > 1 else {}
    g = settings_grid(long, "devices", "value", style=style, col="metric", sharey=False, **rows)
    label(g, "devices", "metric")
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


def model(tables: Tables) -> Figure:
    """Predicted (dpstudy.analysis.scaling) vs measured speedup, one point per setting with the measured
    speedup's 95 % interval as a vertical bar; the diagonal is a perfect model, the dotted lines the
    ideal n x."""
    cells = labelled(tables["cells"])
    title = "Why not n times: the model's speedup vs the measured one"
    from dpstudy.analysis.scaling import by_setting

    table = by_setting(tables["scaling"], tables["settings"])  # measured: the settings' speedup
    if table.empty:
        return message("No multi-device cell finished with a baseline: nothing to model.", title, cells)
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
    label(g, "predicted_speedup", "measured_speedup")
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


def with_settings(rows: pd.DataFrame, cells: pd.DataFrame) -> pd.DataFrame:
    """rows (a `cell` column) of the finished cells, with their setting keys and variant."""
    from dpstudy.analysis.keys import SETTING_KEYS

    keys = [k for k in dict.fromkeys([*SETTING_KEYS, "variant", "workload"]) if k in cells]
    return rows.merge(finished(cells)[["cell", *keys]], on="cell", suffixes=("_row", ""))


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
    label(g, "seconds", "setting")
    return finish(g, title + folded_note(folded), cells)


def accuracy_epochs(tables: Tables) -> Figure:
    """A line per cell; with more than MAX_LINES cells, a line per mode (and batch, when few) through
    the median of its cells, the band their middle half."""
    cells = labelled(tables["cells"])
    title = "Test accuracy per epoch (whole test set, evaluated once)"
    epochs = tables["epochs"].merge(finished(cells)[["cell", "variant", "workload"]], on="cell")
    if epochs.empty:
        return message("No cell finished: there are no epochs to show.", title, cells)
    epochs = epochs.assign(test_acc_pct=epochs["test_acc"] * 100)
    facets = {"height": 3.5, "aspect": 1.3, **hue(epochs), **workload_facets(epochs)}
    count = epochs["cell"].nunique()
    if count <= MAX_LINES:
        g = sns.relplot(
            epochs,
            x="epoch",
            y="test_acc_pct",
            style="global_batch",
            units="cell",
            estimator=None,
            kind="line",
            markers=True,
            **facets,
        )
    else:
        style = {"style": "global_batch"} if epochs["global_batch"].nunique() <= MAX_STYLES else {}
        g = sns.relplot(
            epochs,
            x="epoch",
            y="test_acc_pct",
            estimator="median",
            errorbar=("pi", 50),
            kind="line",
            markers=True,
            **style,
            **facets,
        )
        title += f" - a line per mode: the median of its cells ({count} in all), band: their middle half"
    label(g, "epoch", "test_acc_pct")
    for ax in g.axes.flat:
        ax.set_xticks(sorted(epochs["epoch"].unique()))
    return finish(g, title, cells)


def accuracy_batch(tables: Tables) -> Figure:
    cells = labelled(tables["cells"])
    title = "Final test accuracy vs global batch"
    settings = settings_of(tables).dropna(subset=["final_test_acc"])
    if settings.empty:
        return message("No cell finished: there is no accuracy to show.", title, cells)
    settings = settings.assign(
        **{f"final_test_acc_pct{part}": settings[f"final_test_acc{part}"] * 100 for part in ("", "_low", "_high")}
    )
    return finish(versus_batch(settings, "final_test_acc_pct"), title, cells)


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
    label(g, "peak_mem_mb", "setting")
    return finish(g, title + folded_note(folded), cells)


def backends(tables: Tables) -> Figure:
    cells = labelled(tables["cells"])
    ddp = cells[cells["mode"] == "ddp"]
    title = "DDP throughput: NCCL vs Gloo"
    settings = settings_of(tables)
    ok = settings[settings["mode"] == "ddp"].dropna(subset=["samples_per_s"])
    if ok.empty:
        return message("No DDP cell finished: no backend to compare.", title, ddp)
    ok = ok.assign(devices=ok["devices"].map(lambda n: plural(n, "device")))
    rows = {"row": "workload"} if ok["workload"].nunique() > 1 else {}
    g = settings_grid(ok, "global_batch", "samples_per_s", log=True, col="devices", **rows)
    label(g, "global_batch", "samples_per_s")
    log2_axis(g, ok["global_batch"])
    return finish(g, title, ddp)


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
    label(g, "t", "value")
    return finish(g, title, cells)


def overview(tables: Tables) -> Figure:
    """Heat maps of the median speedup, efficiency and final accuracy over the two setting keys with
    the most values (dpstudy.report.overview.axis_keys), a row per mode; with fewer keys, the modes on
    the y axis. Other varied keys are folded into the median."""
    from dpstudy.report.overview import SETUP_KEYS, axis_keys

    cells = labelled(tables["cells"])
    title = "Overview: median speedup, efficiency and final test accuracy of the settings"
    settings = settings_of(tables)
    if settings.empty:
        return message("No setting finished: there is nothing to map.", title, cells)
    keys = axis_keys(settings, exclude=SETUP_KEYS)
    x, y = (keys + [None, None])[:2]
    if y is None:
        y, rows = "variant", [None]
    else:
        rows = [v for v in hue(settings)["hue_order"]]
    fig = heat_maps(settings, x, y, rows)
    return finish(fig, title + folded_note(hidden_keys(settings, ["variant", *filter(None, (x, y))])), cells)


HEAT_METRICS = {
    "speedup": ("speedup", lambda v: f"{v:.2f}"),
    "efficiency": ("efficiency", lambda v: f"{v:.0%}"),
    "final_test_acc": ("final test accuracy", lambda v: f"{v * 100:.1f}"),
}


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
    text = grid.map(lambda v: "" if pd.isna(v) else fmt(v)) if annotate else False
    sns.heatmap(
        grid,
        ax=ax,
        cmap="viridis",
        annot=text,
        fmt="",
        annot_kws={"fontsize": 7},
        cbar=True,
        linewidths=0.3 if annotate else 0,
        **scale,
    )
    ax.set_xlabel("" if x == "_all" else x)
    ax.set_ylabel("" if y == "variant" else y)
    ax.tick_params(labelsize=7)


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
    facets = {"col": "global_batch"} | ({"row": "workload"} if ran["workload"].nunique() > 1 else {})
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
    label(g, "mb", "setting")
    return finish(g, title + folded_note(folded), cells)


FIGURES: dict[str, Callable[[Tables], Figure]] = {
    "overview.png": overview,
    "throughput.png": throughput,
    "scaling.png": scaling,
    "model.png": model,
    "epoch_split.png": epoch_split,
    "accuracy_epochs.png": accuracy_epochs,
    "accuracy_batch.png": accuracy_batch,
    "memory.png": memory,
    "memory_split.png": memory_split,
    "strategies.png": strategies,
    "backends.png": backends,
    "utilisation.png": utilisation,
}
assert tuple(FIGURES) == outputs.FIGURES, "dpstudy.study.outputs.FIGURES names each figure file"


def render(tables: Tables, out_dir: str | Path) -> list[Path]:
    """Write every figure of FIGURES into out_dir, each file atomically."""
    import matplotlib.pyplot as plt

    sns.set_theme(style="whitegrid", context="notebook")
    paths = []
    for name, make in FIGURES.items():
        fig = make(tables)
        try:
            with atomic_output(Path(out_dir) / name) as tmp:
                fig.savefig(tmp, format="png", dpi=DPI, bbox_inches="tight")
        finally:
            plt.close(fig)
        paths.append(Path(out_dir) / name)
    return paths
