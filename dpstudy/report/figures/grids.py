"""The settings grid: rows of the settings table drawn as a marker per setting with its 95 % interval,
a colour per mode and a line through the medians, on log2 batch axes where batches are shown."""

from __future__ import annotations

import pandas as pd
import seaborn as sns

from dpstudy.report.figures.layout import MARKERS, MAX_STYLES, SPREAD, axis_labels, hue, model_facets


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
    g = settings_grid(settings, "global_batch", y, style="devices", log=True, **model_facets(settings))
    axis_labels(g, "global_batch", y)
    log2_axis(g, settings["global_batch"])
    return g
