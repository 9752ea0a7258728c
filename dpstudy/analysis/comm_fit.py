"""A latency + size / bandwidth model of each collective, fitted to the size sweep of comm_bench.

  t(S) = latency + S / bandwidth       S: the collective's total size in bytes (comm.py's `bytes`)

one fit per (collective, backend, device, world_size): what a forecast costs a DDP bucket or an FSDP
unit with (dpstudy.analysis.calibration), where the bus bandwidth of one size alone misprices the small
messages, which are latency, not bandwidth.

The fit minimises the squared RELATIVE error (each point weighted by 1 / its time): the sweep spans
five orders of magnitude of time, and plain least squares would let the 256 MiB point decide
everything and leave the 4 KiB one wrong by a factor of ten. Both terms are kept non-negative
(scipy's nnls): a collective's time never shrinks with size, nor is its latency below zero.

comm_fit.csv, one row per fit:
  collective, backend, device, world_size   what was fitted
  points, min_bytes, max_bytes              the sizes it rests on: a forecast beyond them extrapolates
  latency_s, bandwidth_gbps                 the two terms (bandwidth: S / the size term, GB/s as algbw)
  rel_rmse, max_rel_error                   the fit's relative residuals over its points
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.optimize import nnls

KEYS = ("collective", "backend", "device", "world_size")
COLUMNS = (*KEYS, "points", "min_bytes", "max_bytes", "latency_s", "bandwidth_gbps", "rel_rmse", "max_rel_error")
MIN_POINTS = 3  # two terms and at least one degree of freedom left to see the fit's error


@dataclass(frozen=True)
class Fit:
    latency_s: float
    seconds_per_byte: float
    residuals: np.ndarray  # (fitted - measured) / measured, per point

    def time(self, nbytes: float) -> float:
        return self.latency_s + nbytes * self.seconds_per_byte

    @property
    def bandwidth_gbps(self) -> float:
        return math.inf if self.seconds_per_byte == 0 else 1e-9 / self.seconds_per_byte


def fit_line(sizes, times) -> Fit:
    """The non-negative latency and per-byte time that fit `times` (s) at `sizes` (bytes) with the
    least squared relative error."""
    sizes, times = np.asarray(sizes, dtype=float), np.asarray(times, dtype=float)
    if len(sizes) != len(times) or len(sizes) < MIN_POINTS:
        raise ValueError(f"a fit needs {MIN_POINTS} or more (size, time) points, got {len(sizes)}")
    if not (np.isfinite(times).all() and (times > 0).all() and (sizes > 0).all()):
        raise ValueError("sizes and times must be positive and finite")
    # a + b S = t, row by row divided by t: the residual of each row is then the relative error
    design = np.column_stack([1 / times, sizes / times])
    (latency, per_byte), _ = nnls(design, np.ones_like(times))
    fitted = latency + per_byte * sizes
    return Fit(float(latency), float(per_byte), (fitted - times) / times)


def timing_column(comm: pd.DataFrame) -> str:
    """What the fits read: `stream_s`, the calls back to back as a backward pass issues them, where
    comm_bench measured it; `median_s` (one call after a barrier) in sweeps made before it."""
    return "stream_s" if "stream_s" in comm and comm["stream_s"].notna().any() else "median_s"


def fit_table(comm: pd.DataFrame) -> pd.DataFrame:
    """comm_fit.csv's rows from comm.csv's: every (collective, backend, device, world size) with
    MIN_POINTS or more timed sizes (rows with a reason, or no time, are not timings), fitted to
    timing_column's times."""
    rows = []
    if comm.empty:
        return pd.DataFrame(rows, columns=list(COLUMNS))
    column = timing_column(comm)
    timed = comm[comm["reason"].isna() & comm[column].notna()]
    for key, group in timed.groupby(list(KEYS), sort=True):
        if len(group) < MIN_POINTS:
            continue
        fit = fit_line(group["bytes"], group[column])
        rows.append(
            {
                **dict(zip(KEYS, key, strict=True)),
                "points": len(group),
                "min_bytes": int(group["bytes"].min()),
                "max_bytes": int(group["bytes"].max()),
                "latency_s": fit.latency_s,
                "bandwidth_gbps": fit.bandwidth_gbps,
                "rel_rmse": float(np.sqrt(np.mean(fit.residuals**2))),
                "max_rel_error": float(np.abs(fit.residuals).max()),
            }
        )
    return pd.DataFrame(rows, columns=list(COLUMNS))


def predicted_time(row: pd.Series | dict, nbytes: float) -> float:
    """Seconds of one collective of `nbytes` by a comm_fit.csv row."""
    return row["latency_s"] + nbytes / (row["bandwidth_gbps"] * 1e9)
