"""The machine's floor (dpstudy.microbench.floor) as a table, and the figures the report sets the
cells' noise against.

floor       one row per run of the reference workload: its repeat round, what it ran on, its
            compute (GFLOP/s), memory (GB/s) and dispatch (million ops/s) rates and the other
            load it saw
The summary's floor columns: floor_runs, floor_compute_cv, floor_memory_cv and floor_dispatch_cv
(the CV of each rate over the runs, as a setting's noise_cv) and floor_cv, the largest of them: a
cell computes, moves memory and dispatches operators, and whichever the machine varies most in
bounds its noise from below. And floor_verdict, the single-device noise set against it
(noise_verdict). Runs made before the dispatch part have no dispatch rate: its CV is then NaN.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from dpstudy.analysis.records import RecordError
from dpstudy.analysis.stats import cv

RATES = ("compute_gflops", "memory_gbps", "dispatch_mops")
REQUIRED_RATES = RATES[:2]  # dispatch_mops came later: older runs lack it
FLOOR_COLUMNS = ("repeat", "device", "device_name", "threads", "seconds", *RATES, "other_load", "host", "path")
SUMMARY_COLUMNS = (
    "floor_runs",
    "floor_compute_cv",
    "floor_memory_cv",
    "floor_dispatch_cv",
    "floor_cv",
    "floor_verdict",
)
# A floor this high is the machine's own (shared, or a VM that drifts): nothing measures steadier.
HIGH_FLOOR = 0.03
# Noise within this many times the floor is the machine's; above it, the cells' own runtime adds some.
NEAR_FLOOR = 2.0
# A CV this low needs no floor to excuse it (issue 24's target for a quiet machine).
STEADY_CV = 0.03


def steady_bound(machine_cv):
    """The most noise a setting may show and still count as measured as steadily as this machine
    allows: STEADY_CV, or NEAR_FLOOR times the machine's own CV at the same moments if that is more
    (a number or a Series of them)."""
    return np.maximum(STEADY_CV, NEAR_FLOOR * machine_cv)


VERDICTS = ("at the floor", "above the floor", "high floor", "below the floor")


def read_run(path: str | Path) -> dict:
    """One run's row; a file that is not a finished run is a RecordError naming it and the key."""
    try:
        run = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise RecordError(f"{path}: not a floor run ({error})") from None
    if not isinstance(run, dict):
        raise RecordError(f"{path}: not a floor run (a JSON object is expected)")
    for key in ("repeat", "device", *REQUIRED_RATES):
        if key not in run:
            raise RecordError(f"{path}: floor run without {key!r}")
    for key in (rate for rate in RATES if rate in run):
        value = run[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise RecordError(f"{path}: floor run's {key} is {value!r}, not a positive rate")
    return {**{column: run.get(column) for column in FLOOR_COLUMNS}, "path": str(path)}


def floor_table(paths: Iterable[str | Path]) -> pd.DataFrame:
    rows = sorted((read_run(path) for path in paths), key=lambda row: row["repeat"])
    return pd.DataFrame(rows, columns=list(FLOOR_COLUMNS))


def noise_verdict(noise_cv: float, floor_cv: float) -> str | None:
    """The largest single-device CV against the floor: "below the floor" (the reference workload
    varied more than the cells: here it bounds nothing), "high floor" (the floor is HIGH_FLOOR or
    more), "at the floor" (noise within NEAR_FLOOR x the floor), "above the floor"; None where
    either is unknown."""
    if math.isnan(floor_cv) or math.isnan(noise_cv):
        return None
    if noise_cv < floor_cv:
        return "below the floor"
    if floor_cv >= HIGH_FLOOR:
        return "high floor"
    return "at the floor" if noise_cv <= NEAR_FLOOR * floor_cv else "above the floor"


def floor_summary(floor: pd.DataFrame, noise_cv: float) -> dict[str, float | str | None]:
    """The summary's floor columns (NaN CVs with fewer than two runs); `noise_cv`: the largest
    single-device setting's CV (NaN: none)."""
    compute, memory, dispatch = (cv(floor[rate].astype(float).dropna()) for rate in RATES)
    known = [value for value in (compute, memory, dispatch) if not math.isnan(value)]
    floor_cv = max(known) if known else math.nan
    return {
        "floor_runs": len(floor),
        "floor_compute_cv": compute,
        "floor_memory_cv": memory,
        "floor_dispatch_cv": dispatch,
        "floor_cv": floor_cv,
        "floor_verdict": noise_verdict(noise_cv, floor_cv),
    }
