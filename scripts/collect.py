"""Collect record.json files into results/tables: one CSV per name in dpstudy.study.outputs.TABLES
(cells, epochs, ranks, util, memory_split; settings, scaling and the tables of every number the report states:
scaling_settings, comparisons, summary, data_wait, memory, memory_accuracy, util_means, varied, pivot) and stale.txt.

    python scripts/collect.py --records R1 R2 ... --out-dir results/tables [--comm comm.csv] [--memory-plan memory.csv]
                              [--floor results/floor/r0.json ...] [--forecast JSON] [--memory-budget-gib G]
    python scripts/collect.py --records-from record_list.txt --out-dir results/tables

A record that cannot be read (truncated, edited by hand) stops it with the file's name and the
command that reruns exactly that cell; with --keep-going (or DPSTUDY_KEEP_GOING=1, which the
workflow sets under `snakemake --keep-going`) the other records are collected and the unreadable
ones are listed in unreadable.txt, which the report shows.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import pandas as pd

from dpstudy import models
from dpstudy.analysis import collect, tablefiles
from dpstudy.analysis import floor as machine_floor
from dpstudy.analysis.records import RecordError
from dpstudy.record.provenance import code_version


def factory_hash(model: str, code_path: str | None) -> str | None:
    """The current hash of a user factory's source (the records' code_version.user_hash)."""
    try:
        return models.factory_hash(model, code_path)
    except ValueError:  # a model this checkout does not know (a record from elsewhere)
        return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", nargs="*", default=[], help="record.json paths")
    parser.add_argument("--records-from", type=Path, help="a file listing record paths, one per line")
    parser.add_argument("--out-dir", type=Path, required=True, help="folder of the tables")
    parser.add_argument("--comm", type=Path, help="comm_bench's comm.csv, for the step model (optional)")
    parser.add_argument("--memory-plan", type=Path, help="the memory plan CSV, predicted beside measured (optional)")
    parser.add_argument("--floor", nargs="*", default=[], help="the machine's floor runs (results/floor/r*.json)")
    parser.add_argument(
        "--forecast",
        type=json.loads,
        default=[],
        help="the forecasts to make, as JSON: dpstudy.study.forecast_requests.requests of the study (default: none)",
    )
    parser.add_argument(
        "--memory-budget-gib",
        type=float,
        help="the study's memory_budget_gib: what a forecast must fit in (default: a CUDA device's memory)",
    )
    parser.add_argument(
        "--keep-going",
        action="store_true",
        default=os.environ.get("DPSTUDY_KEEP_GOING") == "1",
        help="list unreadable records in unreadable.txt and collect the rest (default: stop at the first)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    paths = list(args.records)
    if args.records_from:
        paths += [line.strip() for line in args.records_from.read_text().splitlines() if line.strip()]
    if not paths:
        sys.exit("error: no records given (--records or --records-from)")
    unreadable = [] if args.keep_going else None
    try:
        plan = pd.read_csv(args.memory_plan) if args.memory_plan and args.memory_plan.is_file() else None
        tables = collect.collect(paths, code_version(), plan, factory_hash, unreadable)
        floor = machine_floor.floor_table(args.floor)
    except RecordError as e:
        sys.exit(f"error: {e}")
    for line in unreadable or []:
        print(f"warning: left out (--keep-going): {line}", file=sys.stderr)
    comm = pd.read_csv(args.comm) if args.comm and args.comm.is_file() else None
    tables = collect.summarise(tables, comm, floor, args.forecast, args.memory_budget_gib)
    for path in tablefiles.write_tables(tables, args.out_dir, unreadable or []):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    from dpstudy.util.quick_exit import finish

    finish(main())  # the outputs are written: skip the teardown (dpstudy.util.quick_exit)
