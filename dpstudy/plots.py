"""Figures from the tidy tables: one function per figure, each one seaborn figure-level call.

Every function takes the tables of dpstudy.collect ({"cells", "epochs", "ranks", "util"}) and
returns a matplotlib Figure. Cells that did not finish (skipped, oom, failed) are listed with
their reason under every figure, so nothing disappears silently. FIGURES is the one list of
figure files: the Snakemake rule names its outputs from it.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from dpstudy.atomic import atomic_output
from dpstudy.readable import not_run_lines as not_run_lines_of, plural

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
VARIANTS = ("single", "dp", "ddp/gloo", "ddp/nccl")
LABELS = {  # axis labels
    "global_batch": "global batch (samples per step)", "samples_per_s": "throughput (samples/s)",
    "devices": "devices", "speedup": "speedup vs one device", "efficiency": "scaling efficiency",
    "epoch": "epoch", "test_acc_pct": "test accuracy (%)", "final_test_acc_pct": "final test accuracy (%)",
    "seconds": "seconds per epoch (median of epochs >= 2)", "peak_mem_mb": "peak memory (MB)",
    "t": "seconds since start", "value": "percent", "cell": "", "setting": "", "metric": "",
    "predicted_speedup": "speedup the model predicts", "measured_speedup": "measured speedup",
}
# Legend titles stay about as long as the column names: seaborn sized the legend for those.
LEGEND_TITLES = {"variant": "mode", "devices": "devices", "loss": "largest loss", "global_batch": "global batch", "part": "",
                 "metric": "", "device": "GPU"}
MAX_NOTE_LINES = 12
# Repeats: the median with a 95 % bootstrap interval, as in the tables (dpstudy.stats).
INTERVAL = {"estimator": "median", "errorbar": ("ci", 95), "seed": 0}
DPI = 110


def labelled(cells: pd.DataFrame) -> pd.DataFrame:
    """cells plus `variant` (mode, with the backend for ddp, and the nodes when several: inter-node
    scaling gets a colour of its own) and `workload` (dataset/model)."""
    variant = cells["mode"].where(cells["backend"] == "none", cells["mode"] + "/" + cells["backend"])
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
    lines = not_run_lines_of(rest, "cell", lambda r: r.setting, shown=3)
    if len(lines) > MAX_NOTE_LINES:
        lines = lines[: MAX_NOTE_LINES - 1] + [f"... and {len(lines) - MAX_NOTE_LINES + 1} more reasons (see cells.csv)"]
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
        fig.text(0.01, -0.01, "Not shown (did not finish):\n" + "\n".join(lines),
                 ha="left", va="top", fontsize=7, family="monospace")
    return fig


def message(text: str, title: str, cells: pd.DataFrame) -> Figure:
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(7, 1.5))
    fig.text(0.5, 0.5, text, ha="center", va="center", wrap=True)
    return finish(fig, title, cells)


def bar_size(bars: int) -> dict:
    """Height grows with the number of bars; width stays readable for long cell ids."""
    height = max(2.5, 1.0 + 0.3 * bars)
    return {"height": height, "aspect": 8.0 / height}


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


def versus_batch(ok: "pd.DataFrame", y: str) -> "sns.FacetGrid":
    """y against the global batch (log2 axis), a line per mode and device count."""
    g = sns.relplot(ok, x="global_batch", y=y, style="devices", kind="line", markers=True, **INTERVAL,
                    height=3.5, aspect=1.3, **hue(ok), **workload_facets(ok))
    label(g, "global_batch", y)
    log2_axis(g, ok["global_batch"])
    return g


def throughput(tables: Tables) -> Figure:
    cells = labelled(tables["cells"])
    title = "Throughput vs global batch, by mode and device count"
    ok = finished(cells)
    if ok.empty:
        return message("No cell finished: there is no throughput to show.", title, cells)
    return finish(versus_batch(ok, "samples_per_s"), title, cells)


def scaling(tables: Tables) -> Figure:
    cells = labelled(tables["cells"])
    title = "Speedup and efficiency vs one device (grey dotted: ideal)"
    multi = finished(cells).dropna(subset=["speedup"]).query("devices > 1")
    if multi.empty:
        return message("No multi-device cell finished with a baseline: no speedup to show.", title, cells)
    # every line starts at the single-device point (1 device, speedup 1)
    origins = multi[["variant", "workload", "batch"]].drop_duplicates().assign(devices=1, speedup=1.0, efficiency=1.0)
    long = pd.concat([multi, origins]).melt(id_vars=["variant", "workload", "devices", "batch"],
                                            value_vars=["speedup", "efficiency"], var_name="metric",
                                            value_name="value")
    rows = {"row": "workload"} if long["workload"].nunique() > 1 else {}
    g = sns.relplot(long, x="devices", y="value", col="metric", style="batch", kind="line", markers=True,
                    **INTERVAL, height=3.5, facet_kws={"sharey": False}, **hue(long), **rows)
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
    """Predicted (dpstudy.scaling) vs measured speedup, one point per setting; the diagonal is a
    perfect model, the dotted lines the ideal n x."""
    from dpstudy.scaling import by_setting

    cells = labelled(tables["cells"])
    title = "Why not n times: the model's speedup vs the measured one"
    table = by_setting(tables["scaling"])
    if table.empty:
        return message("No multi-device cell finished with a baseline: nothing to model.", title, cells)
    table = labelled(table).assign(loss=table["largest"].str.split(" [(]").str[0])
    g = sns.relplot(table, x="predicted_speedup", y="measured_speedup", style="loss", size="devices",
                    sizes=(40, 160), height=4, aspect=1.2, **hue(table))
    top = max(table["predicted_speedup"].max(), table["measured_speedup"].max(), table["devices"].max()) * 1.1
    for ax in g.axes.flat:
        ax.plot([0, top], [0, top], ls="-", color="0.6", lw=0.8)
        for n in sorted(table["devices"].unique()):
            ax.axhline(n, ls=":", color="0.4", lw=0.8)
        ax.set_xlim(0, top)
        ax.set_ylim(0, top)
    label(g, "predicted_speedup", "measured_speedup")
    return finish(g, title, cells)


def epoch_split(tables: Tables) -> Figure:
    cells = labelled(tables["cells"])
    title = "Each epoch: waiting for data vs computing"
    epochs = tables["epochs"].merge(finished(cells)[["cell"]], on="cell")
    steady = epochs[~epochs["warmup"].astype(bool)]
    if steady.empty:
        return message("No cell finished: there are no epochs to show.", title, cells)
    steady = steady.assign(setting=setting_of(steady["cell"]))
    per_setting = steady.groupby("setting")[["data_wait_s", "compute_s"]].median().reset_index()
    long = per_setting.melt(id_vars="setting", var_name="part", value_name="seconds")
    long["part"] = long["part"].map({"data_wait_s": "waiting for data", "compute_s": "computing"})
    # a stacked histogram weighted by seconds draws one stacked bar per setting (median of repeats)
    g = sns.displot(long, y="setting", weights="seconds", hue="part", hue_order=["computing", "waiting for data"],
                    multiple="stack", discrete=True, shrink=0.8, **bar_size(len(per_setting)))
    label(g, "seconds", "setting")
    return finish(g, title, cells)


def accuracy_epochs(tables: Tables) -> Figure:
    cells = labelled(tables["cells"])
    title = "Test accuracy per epoch (whole test set, evaluated once)"
    epochs = tables["epochs"].merge(finished(cells)[["cell", "variant", "workload"]], on="cell")
    if epochs.empty:
        return message("No cell finished: there are no epochs to show.", title, cells)
    epochs = epochs.assign(test_acc_pct=epochs["test_acc"] * 100)
    g = sns.relplot(epochs, x="epoch", y="test_acc_pct", style="global_batch", units="cell", estimator=None,
                    kind="line", markers=True, height=3.5, aspect=1.3, **hue(epochs), **workload_facets(epochs))
    label(g, "epoch", "test_acc_pct")
    for ax in g.axes.flat:
        ax.set_xticks(sorted(epochs["epoch"].unique()))
    return finish(g, title, cells)


def accuracy_batch(tables: Tables) -> Figure:
    cells = labelled(tables["cells"])
    title = "Final test accuracy vs global batch"
    ok = finished(cells).dropna(subset=["final_test_acc"])
    if ok.empty:
        return message("No cell finished: there is no accuracy to show.", title, cells)
    ok = ok.assign(final_test_acc_pct=ok["final_test_acc"] * 100)
    return finish(versus_batch(ok, "final_test_acc_pct"), title, cells)


def memory(tables: Tables) -> Figure:
    cells = labelled(tables["cells"])
    devices = " and ".join(sorted(cells["env_device"].dropna().unique())) or "unknown device"
    title = f"Peak memory per rank, last epoch (ran on {devices}; GPU: peak allocated, CPU: peak RSS)"
    ranks = tables["ranks"]
    last = ranks[ranks["epoch"] == ranks.groupby("cell")["epoch"].transform("max")]
    last = last.merge(finished(cells)[["cell"]], on="cell")
    if last.empty:
        return message("No cell finished: there is no memory to show.", title, cells)
    last = last.assign(rank=last["rank"].map("rank {}".format), setting=setting_of(last["cell"]))
    g = sns.catplot(last, x="peak_mem_mb", y="setting", hue="rank", kind="bar", orient="h", **INTERVAL,
                    **bar_size(last[["setting", "rank"]].drop_duplicates().shape[0]))
    label(g, "peak_mem_mb", "setting")
    return finish(g, title, cells)


def backends(tables: Tables) -> Figure:
    cells = labelled(tables["cells"])
    ddp = cells[cells["mode"] == "ddp"]
    title = "DDP throughput: NCCL vs Gloo"
    ok = finished(ddp)
    if ok.empty:
        return message("No DDP cell finished: no backend to compare.", title, ddp)
    ok = ok.assign(devices=ok["devices"].map(lambda n: plural(n, "device")))
    rows = {"row": "workload"} if ok["workload"].nunique() > 1 else {}
    g = sns.catplot(ok, x="global_batch", y="samples_per_s", col="devices", kind="bar", **INTERVAL,
                    height=3.5, aspect=1.2, **hue(ok), **rows)
    label(g, "global_batch", "samples_per_s")
    return finish(g, title, ddp)


def utilisation(tables: Tables) -> Figure:
    cells = labelled(tables["cells"])
    title = "GPU utilisation and memory bandwidth use over time"
    util = tables["util"]
    if util.empty:
        ran_on = ", ".join(sorted(cells["env_device"].dropna().unique())) or "no device"
        return message(f"No GPU utilisation was sampled in this study (cells ran on: {ran_on}).", title, cells)
    long = util.melt(id_vars=["cell", "device", "t"], value_vars=["gpu_util", "mem_util"],
                     var_name="metric", value_name="value")
    long["metric"] = long["metric"].map({"gpu_util": "GPU busy", "mem_util": "memory busy"})
    long["device"] = long["device"].map("GPU {}".format)
    n = long["cell"].nunique()
    g = sns.relplot(long, x="t", y="value", hue="device", style="metric", col="cell", col_wrap=min(n, 3),
                    kind="line", height=3, aspect=1.4)
    label(g, "t", "value")
    return finish(g, title, cells)


FIGURES: dict[str, Callable[[Tables], Figure]] = {
    "throughput.png": throughput,
    "scaling.png": scaling,
    "model.png": model,
    "epoch_split.png": epoch_split,
    "accuracy_epochs.png": accuracy_epochs,
    "accuracy_batch.png": accuracy_batch,
    "memory.png": memory,
    "backends.png": backends,
    "utilisation.png": utilisation,
}


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
