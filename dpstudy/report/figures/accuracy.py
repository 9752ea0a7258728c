"""Accuracy: test accuracy per epoch, and the settings' final test accuracy against the global batch."""

from __future__ import annotations

from typing import TYPE_CHECKING

import seaborn as sns

from dpstudy.analysis.summary import finished
from dpstudy.report.figures.grids import versus_batch
from dpstudy.report.figures.layout import (
    MAX_LINES,
    MAX_STYLES,
    Tables,
    axis_labels,
    figure,
    finish,
    hue,
    labelled,
    message,
    model_facets,
    settings_of,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@figure
def accuracy_epochs(tables: Tables) -> Figure:
    """A line per cell; with more than MAX_LINES cells, a line per mode (and batch, when few) through
    the median of its cells, the band their middle half."""
    cells = labelled(tables["cells"])
    title = "Test accuracy per epoch (whole test set, evaluated once)"
    epochs = tables["epochs"].merge(finished(cells)[["cell", "variant", "dataset_model"]], on="cell")
    if epochs.empty:
        return message("No cell finished: there are no epochs to show.", title, cells)
    epochs = epochs.assign(test_acc_pct=epochs["test_acc"] * 100)
    facets = {"height": 3.5, "aspect": 1.3, **hue(epochs), **model_facets(epochs)}
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
    axis_labels(g, "epoch", "test_acc_pct")
    for ax in g.axes.flat:
        ax.set_xticks(sorted(epochs["epoch"].unique()))
    return finish(g, title, cells)


@figure
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
