"""Figures of the benchmark tables: one seaborn figure-level call each, long-format data, log
scales; rows that could not run are named in the title instead of silently missing."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import seaborn as sns

from dpstudy.util.atomic import atomic_output


def _not_run(df: pd.DataFrame, keys: list[str]) -> str:
    skipped = df[df.reason.notna()].drop_duplicates(keys + ["reason"])
    if skipped.empty:
        return ""
    parts = sorted({f"{'/'.join(str(r[k]) for k in keys)} ({r['reason']})" for _, r in skipped.iterrows()})
    return "\nnot run: " + "; ".join(parts)


def _save(grid: sns.FacetGrid, png: str | Path) -> None:
    with atomic_output(png) as tmp:
        grid.savefig(tmp, dpi=120, bbox_inches="tight")


def kernels_figure(csv: str | Path, png: str | Path) -> None:
    """Median time per implementation, one panel per op and shape; loops marked when scaled up."""
    df = pd.read_csv(csv)
    ran = df[df.reason.isna()].copy()
    ran["impl"] = ran.impl.where(~ran.extrapolated.astype(bool), ran.impl + " (extrapolated)")
    ran["case"] = ran.op + "\n" + ran["shape"]
    # Dots, not bars: the times span six decades and a bar from zero has no log-scale length.
    # One shared time axis, so panels compare at a glance.
    grid = sns.catplot(
        data=ran,
        kind="strip",
        x="median_s",
        y="impl",
        hue="device",
        col="case",
        col_wrap=3,
        order=list(dict.fromkeys(ran.impl)),
        jitter=False,
        size=8,
        log_scale=(True, False),
        height=2.2,
        aspect=1.8,
    )
    grid.set_axis_labels("median time per call (s)", "")
    grid.set_titles("{col_name}")
    grid.figure.suptitle(
        f"Kernels: extension vs Python loop vs PyTorch{_not_run(df, ['impl', 'device'])}",
        y=1.0,
        va="bottom",
        parse_math=False,
    )  # reasons are text, not mathtext
    _save(grid, png)


def comm_figure(csv: str | Path, png: str | Path) -> None:
    """Bus bandwidth against message size (the total size S), one panel per collective (and a row
    of them per world size where several ran), a line per backend and device."""
    df = pd.read_csv(csv)
    if "collective" not in df:  # a comm.csv from before all_gather and reduce_scatter
        df["collective"] = "all_reduce"
    ran = df[df.reason.isna()]
    worlds = sorted(int(n) for n in df.world_size.unique())
    grid = sns.relplot(
        row="world_size" if len(worlds) > 1 else None,
        data=ran,
        kind="line",
        x="bytes",
        y="busbw_gbps",
        hue="backend",
        style="device",
        col="collective",
        col_order=[c for c in ("all_reduce", "all_gather", "reduce_scatter") if c in set(df.collective)],
        markers=True,
        height=3.2,
        aspect=1.2,
    )
    grid.set(xscale="log", yscale="log")
    grid.set_axis_labels("total size S (bytes)", "bus bandwidth (GB/s)")
    grid.set_titles("{col_name}, {row_name} processes" if len(worlds) > 1 else "{col_name}")
    grid.figure.suptitle(
        f"Collectives across {' and '.join(map(str, worlds))} processes (bus bandwidth: S/time x 2(n-1)/n "
        f"for all_reduce,\nx (n-1)/n for all_gather and reduce_scatter){_not_run(df, ['backend', 'device'])}",
        y=1.0,
        va="bottom",
        parse_math=False,
    )  # reasons are text, not mathtext
    _save(grid, png)
