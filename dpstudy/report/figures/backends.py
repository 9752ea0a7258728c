"""NCCL against Gloo: the reference mode's (DDP's) throughput per backend against the global batch, a
panel per device count."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpstudy.report.figures.grids import log2_axis, settings_grid
from dpstudy.report.figures.layout import Tables, axis_labels, figure, finish, labelled, message, settings_of
from dpstudy.report.text import plural
from dpstudy.study import modes

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@figure
def backends(tables: Tables) -> Figure:
    cells = labelled(tables["cells"])
    ddp = cells[cells["mode"] == modes.REFERENCE[0]]
    title = "DDP throughput: NCCL vs Gloo"
    settings = settings_of(tables)
    ok = settings[settings["mode"] == modes.REFERENCE[0]].dropna(subset=["samples_per_s"])
    if ok.empty:
        return message("No DDP cell finished: no backend to compare.", title, ddp)
    ok = ok.assign(devices=ok["devices"].map(lambda n: plural(n, "device")))
    rows = {"row": "dataset_model"} if ok["dataset_model"].nunique() > 1 else {}
    g = settings_grid(ok, "global_batch", "samples_per_s", log=True, col="devices", **rows)
    axis_labels(g, "global_batch", "samples_per_s")
    log2_axis(g, ok["global_batch"])
    return finish(g, title, ddp)
