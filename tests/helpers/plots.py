"""What the figure tests share: tables collected from generated records, and what a figure drew."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from dpstudy.analysis import collect
from helpers.records import CURRENT, make_record, write_records


def tables_of(directory: Path, records: list[dict]) -> dict[str, pd.DataFrame]:
    return collect.summarise(collect.collect(write_records(directory, records), CURRENT))


def repeated(rates: list[float], **keys) -> list[dict]:
    """One record per throughput in `rates`: the repeats r0, r1, ... of one setting."""
    return [make_record(samples_per_s=rate, repeat=i, suffix=f"-r{i}", **keys) for i, rate in enumerate(rates)]


def errorbars(ax) -> list[tuple[list[tuple], list]]:
    """(marker points, error bar segments) of every errorbar drawn on `ax`."""
    from matplotlib.container import ErrorbarContainer

    found = []
    for container in ax.containers:
        if isinstance(container, ErrorbarContainer):
            data_line, _, bars = container.lines
            points = list(zip(data_line.get_xdata(), data_line.get_ydata()))
            found.append((points, [s.tolist() for c in bars for s in c.get_segments() if len(s)]))  # NaN: none
    return found
