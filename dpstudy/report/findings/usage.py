"""Where the time went: the share of training spent waiting for data, by loader and by mode, and
the GPUs' mean utilisation."""

from __future__ import annotations

import pandas as pd

from dpstudy.report.findings.phrases import (
    Tables,
    clipped,
    not_measured,
    percent,
    setup_name,
    table_csv,
    whole,
    why_not_run,
)
from dpstudy.report.text import code, plural, text


def loader_name(loader: str, workers: int, augment: str | None = None) -> str:
    name = "loader device" if loader == "device" else f"loader torch/{plural(whole(workers), 'worker')}"
    return name + (f", augment {text(augment)}" if augment else "")


def data_wait(tables: Tables) -> str:
    """Share of the training time spent waiting for data, by loader (and by mode): the data_wait
    table (dpstudy.analysis.summary.wait_table)."""
    cells, wait = tables["cells"], tables["data_wait"]
    if wait.empty:
        return not_measured(why_not_run(cells))
    loaders, setups = wait[wait["by"] == "loader"], wait[wait["by"] == "setup"]
    named = [
        f"{percent(r['share'])} with "
        f"{loader_name(r['loader'], r['workers'], r['augment'] if pd.notna(r['augment']) else None)}"
        for _, r in loaders.iterrows()
    ]
    sentence = f"Waiting for data took {named[0].replace(' with ', ' of the training time with ', 1)}"
    sentence += " (the only loader in this study)." if len(named) == 1 else f" vs {', '.join(named[1:])}."
    return (
        sentence
        + " By mode: "
        + ", ".join(
            f"{setup_name(r['mode'], r['backend'], whole(r['gpus']), whole(r['nodes']), r.get('shard'))} "
            f"{percent(r['share'])}"
            for _, r in setups.iterrows()
        )
        + "."
    )


def utilisation(tables: Tables) -> str:
    """Mean GPU utilisation per cell and GPU (the util_means table)."""
    means, cells = tables["util_means"], tables["cells"]
    if means.empty:
        ran_on = ", ".join(text(d) for d in sorted(cells["env_device"].dropna().unique())) or "unknown"
        return not_measured(f"GPU utilisation was not sampled (the cells ran on {ran_on})")
    lines = [
        f"- {code(cell)}: "
        + ", ".join(f"GPU {text(whole(d))} {v:.0f} %" for d, v in zip(per["device"], per["gpu_util"]))
        + " busy on average."
        for cell, per in means.groupby("cell", sort=True)
    ]
    return "\n".join(clipped(lines, table_csv("util"), "cell"))
