"""The tables on disk: results/tables/{name}.csv for every name in TABLES (dpstudy/study/outputs.py)
and stale.txt, written by scripts/collect.py and read back by the figures and the report.

Tables are written atomically, each one either the old or the complete new file. This module
imports no statistics: reading the tables back costs pandas alone.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from dpstudy.study.outputs import STALE_FILE, TABLES, UNREADABLE_FILE
from dpstudy.util.atomic import write_csv, write_text

# Columns that are text however they look: space-separated setting numbers (one alone would read
# as a float), and identifiers and versions, which pandas would read as numbers: a source hash
# 3819e1247242 as inf (seen), a git commit of digits as an int, CUDA 12.10 as 12.1, a job id as 8.0.
TEXT = {
    "cells": {
        column: str
        for column in (
            "source_hash",
            "git_commit",
            "job_id",
            "pack",
            "torch",
            "cuda",
            "nccl",
            "python",
            "driver",
            "hostname",
        )
    },
    "comparisons": {"members": str},
    "strategies": {"model_misorders": str},
}


def stale_records(cells: pd.DataFrame) -> list[str]:
    """Record paths of the cells made with older training code, for `snakemake --forcerun`."""
    return cells.loc[cells["stale"].astype(bool), "record"].tolist()


def write_tables(tables: dict[str, pd.DataFrame], out_dir: str | Path, unreadable: list[str] = ()) -> list[Path]:
    """{name}.csv for every table, stale.txt (one record path per line; empty when none) and
    unreadable.txt (one line per record collect could not read; empty when none)."""
    out_dir = Path(out_dir)
    written = []
    for name, table in tables.items():
        write_csv(table, out_dir / f"{name}.csv")
        written.append(out_dir / f"{name}.csv")
    write_text(out_dir / STALE_FILE, "".join(f"{p}\n" for p in stale_records(tables["cells"])))
    write_text(out_dir / UNREADABLE_FILE, "".join(f"{line}\n" for line in unreadable))
    return written + [out_dir / STALE_FILE, out_dir / UNREADABLE_FILE]


def read_tables(tables_dir: str | Path) -> dict[str, pd.DataFrame]:
    """The tables written by write_tables, keyed as dpstudy.analysis.collect.summarise returns them."""
    return {name: pd.read_csv(Path(tables_dir) / f"{name}.csv", dtype=TEXT.get(name)) for name in TABLES}
