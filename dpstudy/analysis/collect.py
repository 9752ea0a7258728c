"""Records -> tables (docs/design.md, Tables): the two steps of scripts/collect.py.

`collect` reads and validates the records (dpstudy.analysis.records) and makes the tables of
records: cells, epochs, ranks and util (dpstudy.analysis.tables) and memory_split
(dpstudy.analysis.memory). `summarise` derives every other table of TABLES from them.
dpstudy.analysis.tablefiles writes them as CSV and reads them back.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from dpstudy.analysis import (
    comm_fit,
    comparisons,
    forecast_table,
    largest_batch,
    memory,
    pivots,
    scaling,
    stats,
    strategies,
    strategy_forecasts,
    summary,
    utilisation,
)
from dpstudy.analysis import floor as machine_floor
from dpstudy.analysis.records import read_records
from dpstudy.analysis.tables import FactoryHash, cells_table, epochs_table, ranks_table, util_table


def collect(
    record_paths: Iterable[str | Path],
    current_code_version: dict[str, Any],
    plan: pd.DataFrame | None = None,
    factory_hash: FactoryHash | None = None,
    unreadable: list[str] | None = None,
) -> dict[str, pd.DataFrame]:
    """{"cells", "epochs", "ranks", "util", "memory_split"} tables from the records at
    `record_paths`; `plan` is the memory plan (dpstudy.workflow.memory_plan) or None.

    A cell is stale when its record's code_version.source_hash differs from
    `current_code_version["source_hash"]` (see dpstudy.record.provenance.code_version), or its
    user_hash from `factory_hash(model, code_path)`, the current hash of its model's factory
    (scripts/collect.py gives it; this module imports neither the models nor the training code).
    A record that cannot be read or is not valid raises dpstudy.analysis.records.RecordError, or,
    given `unreadable` (a list), is left out and described there.
    """
    records = read_records(record_paths, unreadable)
    cells = cells_table(records, current_code_version.get("source_hash"), factory_hash)
    return {
        "cells": cells,
        "epochs": epochs_table(records),
        "ranks": ranks_table(records),
        "util": util_table(records),
        "memory_split": memory.split_table(memory.measured_rows(records), plan, cells),
    }


def summarise(
    tables: dict[str, pd.DataFrame],
    comm: pd.DataFrame | None = None,
    floor: pd.DataFrame | None = None,
    requests: list[dict] | None = None,
    budget_gib: float | None = None,
) -> dict[str, pd.DataFrame]:
    """`tables` plus "settings" (repeats as medians and 95 % intervals, dpstudy.analysis.stats),
    "scaling" (the step model's why-not-N-x breakdown per cell, dpstudy.analysis.scaling; `comm` is
    comm_bench's table or None, fitted per collective) and "scaling_settings" (the model per setting);
    "comparisons" (settings against settings, dpstudy.analysis.comparisons); "strategies" (each
    workload's strategies ranked, dpstudy.analysis.strategies, with the forecast ones beside them,
    strategy_forecasts);
    "summary", "data_wait", "memory" and "util_means" (dpstudy.analysis.summary);
    "memory_accuracy" and "memory_spread" (dpstudy.analysis.memory);
    "varied" and "pivot" (the overview's numbers, dpstudy.analysis.pivots); "floor", the machine's
    floor runs (`floor`, dpstudy.analysis.floor.floor_table; None: the study measured none);
    "comm_fit", each collective's latency and bandwidth fitted to `comm` (dpstudy.analysis.comm_fit);
    "forecasts", every measured DDP and FSDP setting forecast from the others and the forecasts `requests`
    asks for (dpstudy.study.forecast_requests.requests; dpstudy.analysis.forecast_table), each held against
    `budget_gib` (the study's memory_budget_gib) or the CUDA device's memory (capacity); "largest_batch",
    each strategy at the largest per-device batch that fits the same capacity (dpstudy.analysis.largest_batch)."""
    floor = machine_floor.floor_table([]) if floor is None else floor
    cells, epochs = utilisation.with_utilisation(tables["cells"], floor), tables["epochs"]
    settings = utilisation.settings_with_utilisation(stats.settings_table(cells), cells)
    fits = comm_fit.fit_table(comm if comm is not None else pd.DataFrame())
    model, model_by_setting = scaling.tables(cells, epochs, settings, fits)
    forecasts = forecast_table.forecasts(
        settings, cells, fits, requests or [], tables["memory_split"], budget_gib, epochs
    )
    forecasts = utilisation.forecasts_in_tokens(forecasts, cells)
    held_out = forecast_table.held_out_by_setting(forecasts, settings)
    ranked = strategies.strategies_table(cells, settings, model_by_setting, tables["memory_split"], held_out)
    return {
        **tables,
        "cells": cells,
        "settings": settings,
        "scaling": model,
        "scaling_settings": model_by_setting,
        "comparisons": comparisons.comparisons_table(settings, cells),
        "strategies": strategy_forecasts.with_forecasts(ranked, forecasts),
        "summary": summary.summary_table(cells, settings, floor),
        "data_wait": summary.wait_table(cells, epochs),
        "memory": summary.memory_table(cells),
        "memory_accuracy": memory.accuracy_table(tables["memory_split"]),
        "memory_spread": memory.spread_table(tables["memory_split"], cells),
        "util_means": summary.util_means(tables["util"]),
        **pivots.overview_tables(settings),
        "floor": floor,
        "comm_fit": fits,
        "forecasts": forecasts,
        "largest_batch": largest_batch.largest_batch_table(cells, settings, tables["memory_split"], fits, budget_gib),
    }
