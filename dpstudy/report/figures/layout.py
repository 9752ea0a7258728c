"""What every figure shares: the registry of figure functions, labels and colours, the size limits,
and the frame (readable titles, the cells that did not finish listed below, a message instead of
an empty plot)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pandas as pd
import seaborn as sns

from dpstudy.analysis.summary import finished
from dpstudy.report.text import more_in, not_run_lines
from dpstudy.study import modes

if TYPE_CHECKING:
    from matplotlib.figure import Figure

Tables = dict[str, pd.DataFrame]
Draw = Callable[[Tables], "Figure"]
# Filled by @figure as the topic modules are imported; the package checks it against
# dpstudy.study.outputs.FIGURES, the one list of figure files.
DRAWN: dict[str, Draw] = {}
# Every variant a legend may hold, in the modes' table's order: each keeps its colour in every figure
VARIANTS = tuple(modes.variants())
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


def figure(draw: Draw) -> Draw:
    """Registers `draw` as the function of the figure file named after it (scaling: scaling.png)."""
    DRAWN[f"{draw.__name__}.png"] = draw
    return draw


def labelled(cells: pd.DataFrame) -> pd.DataFrame:
    """cells plus `variant` (the scheme: mode and shard, the backend of a process-group mode, and
    the nodes when several: inter-node scaling gets a colour of its own) and `dataset_model`
    (dataset/model)."""
    scheme = cells["mode"].where(cells["shard"] == modes.NO_SHARD, cells["mode"] + " " + cells["shard"])
    variant = scheme.where(cells["backend"] == "none", scheme + "/" + cells["backend"])
    variant = variant.where(cells["nodes"] <= 1, variant + " on " + cells["nodes"].astype("string") + " nodes")
    return cells.assign(variant=variant, dataset_model=cells["dataset"] + "/" + cells["model"])


def hue(data: pd.DataFrame) -> dict:
    """The same colour for a mode in every figure."""
    present = set(data["variant"])
    order = [v for v in VARIANTS if v in present] + sorted(present - set(VARIANTS))
    colours = sns.color_palette("colorblind", len(VARIANTS) + len(order))
    palette = {v: colours[VARIANTS.index(v) if v in VARIANTS else len(VARIANTS) + i] for i, v in enumerate(order)}
    return {"hue": "variant", "hue_order": order, "palette": palette}


def settings_of(tables: Tables) -> pd.DataFrame:
    """The settings table (dpstudy.analysis.stats.settings_table: a row per setting, its repeats combined
    with a 95 % interval) with variant and dataset_model. Every speedup, efficiency, throughput and final
    accuracy a figure draws comes from there, so a figure shows the numbers the report prints."""
    return labelled(tables["settings"])


def with_settings(rows: pd.DataFrame, cells: pd.DataFrame) -> pd.DataFrame:
    """rows (a `cell` column) of the finished cells, with their setting keys and variant."""
    from dpstudy.analysis.keys import SETTING_KEYS

    keys = [k for k in dict.fromkeys([*SETTING_KEYS, "variant", "dataset_model"]) if k in cells]
    return rows.merge(finished(cells)[["cell", *keys]], on="cell", suffixes=("_row", ""))


def model_facets(data: pd.DataFrame) -> dict:
    n = data["dataset_model"].nunique()
    return {"col": "dataset_model", "col_wrap": min(n, 3)} if n > 1 else {}


def setting_of(cells: pd.Series) -> pd.Series:
    """A cell's setting: its id without the repeat suffix (-r2); repeats share one bar or line."""
    return cells.str.replace(r"-r\d+$", "", regex=True)


def note_lines(cells: pd.DataFrame) -> list[str]:
    """One line per reason, naming a few of its settings (see cells.csv for all)."""
    rest = cells[cells["status"] != "ok"].sort_values("cell")
    rest = rest.assign(setting=setting_of(rest["cell"]))
    lines = not_run_lines(rest, "cell", lambda r: r.setting, shown=3, markdown=False)  # plain text for matplotlib
    if len(lines) > MAX_NOTE_LINES:
        more = len(lines) - MAX_NOTE_LINES + 1
        lines = lines[: MAX_NOTE_LINES - 1] + [more_in(more, "cells.csv", "reason", markdown=False)]
    return lines


def finish(fig_or_grid: Figure | sns.FacetGrid, title: str, cells: pd.DataFrame) -> Figure:
    """Facet and legend titles made readable; the cells that did not finish listed below the figure."""
    fig = fig_or_grid
    if isinstance(fig_or_grid, sns.FacetGrid):
        fig = fig_or_grid.figure
        fig_or_grid.set_titles(row_template="{row_name}", col_template="{col_name}", size=9)
        legend = fig_or_grid.legend
        for entry in [legend.get_title(), *legend.texts] if legend else []:
            entry.set_text(LEGEND_TITLES.get(entry.get_text(), entry.get_text()))
        fig_or_grid.tight_layout()  # again: the labels changed after seaborn laid the grid out
    fig.suptitle(title, y=1.02)
    lines = note_lines(cells)
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


def message(words: str, title: str, cells: pd.DataFrame) -> Figure:
    """A figure that says why there is nothing to draw, in place of empty axes."""
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(7, 1.5))
    fig.text(0.5, 0.5, words, ha="center", va="center", wrap=True, parse_math=False)
    return finish(fig, title, cells)


def axis_labels(grid: sns.FacetGrid, x: str, y: str) -> None:
    grid.set_axis_labels(LABELS[x], LABELS[y])


def folded_note(folded: list[str]) -> str:
    return f" (medians over settings that differ in {', '.join(folded)})" if folded else ""
