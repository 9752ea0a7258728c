"""Forecasts of DDP settings from the measured ones, each checked against a setting held out.

Per workload (every setting key but the strategy's and the batch: FORECAST_GROUP), from the study's
own settings table, cells' probes and the collectives' fits (dpstudy.analysis.comm_fit):

  t1(b)       a single-device step at batch b: b / its measured throughput; elsewhere the line
              a + c b through the measured batches (least squares; one batch: c b)
  exposed     the all-reduce that backward did not hide, per step: the probe's step with the
              all-reduce minus the step under no_sync
  share(n)    how much slower one rank's step is when n ranks share the host:
              (the measured DDP step - exposed) / t1(b), median over the calibrating settings at n
  hidden(n)   exposed / the all-reduce of the gradient as comm_fit prices it at n ranks
  step(n, b)  t1(b) share(n) + hidden(n) allreduce_n(gradient bytes)
  throughput  B / step(n, B / n) for a global batch B; speedup over t1's throughput at B

World sizes without a calibrating setting extrapolate: share grows linearly from 1 at one rank
through the largest calibrated n, hidden is the nearest n's, and the all-reduce follows the ring
from the fit at the nearest world size (latency x (n - 1), bytes x 2(n - 1)/n over its bus
bandwidth). Each forecast says which (`how`: interpolated or extrapolated, `basis`).

Memory per device: dpstudy.analysis.memory_forecast's line in the per-device batch. The 95 %
interval of a forecast is exp(+-1.96 sigma) around it, sigma the model's log error on settings held
out (dpstudy.analysis.predictions, which makes the table), widened by 1 + the log2-distance to the
calibrated world sizes and batches when extrapolating.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dpstudy.analysis.comm_fit import predicted_time
from dpstudy.analysis.keys import SETTING_KEYS
from dpstudy.analysis.linefit import line_fit
from dpstudy.analysis.memory_forecast import MemoryLine
from dpstudy.analysis.strategies import STRATEGY_KEYS

BATCH_KEYS = ("batch", "global_batch", "devices")
FORECAST_GROUP = tuple(k for k in SETTING_KEYS if k not in (*STRATEGY_KEYS, *BATCH_KEYS))
Z95 = 1.96


def ring_allreduce(fits: pd.DataFrame, backend: str, device: str, n: int, nbytes: float) -> tuple[float, bool]:
    """(seconds of an all-reduce of `nbytes` over n ranks, whether it extrapolated): the fit at n
    within its sizes, else the ring model from the nearest world size's fit."""
    rows = fits[(fits["collective"] == "all_reduce") & (fits["backend"] == backend) & (fits["device"] == device)]
    if rows.empty:
        raise LookupError(f"no all_reduce fit for {backend} on {device} (comm_bench)")
    near = rows.iloc[(rows["world_size"] - n).abs().argsort()].iloc[0]
    m = int(near["world_size"])
    inside = m == n and near["min_bytes"] <= nbytes <= near["max_bytes"]
    if m == n:
        return predicted_time(near, nbytes), not inside
    per_hop = near["latency_s"] / max(m - 1, 1)
    busbw = near["bandwidth_gbps"] * 1e9 * 2 * (m - 1) / m
    return per_hop * (n - 1) + nbytes * 2 * (n - 1) / n / busbw, True


class Workload:
    """The calibrated model of one workload (one FORECAST_GROUP value)."""

    def __init__(self, single: pd.DataFrame, ddp: pd.DataFrame, fits: pd.DataFrame):
        self.batches = sorted(single["global_batch"].astype(float))
        self.single = dict(zip(single["global_batch"].astype(float), single["global_batch"] / single["samples_per_s"]))
        self.a, self.c = line_fit(self.single, self.single.values())
        self.fits = fits
        # memory_mb: the settings' step peak (dpstudy.analysis.memory_forecast), NaN where not measured
        self.memory = MemoryLine(
            list(zip(single["global_batch"].astype(float), single["memory_mb"], strict=True)),
            list(zip(ddp["global_batch"] / ddp["devices"], ddp["memory_mb"], strict=True)),
        )
        self.calibrated: dict[tuple[str, int], dict] = {}
        for (backend, n), rows in ddp.groupby(["backend", "devices"]):
            share, hidden = [], []
            for _, row in rows.iterrows():
                b = row["global_batch"] / n
                exposed = max(0.0, row["sync_step_s"] - row["nosync_step_s"])
                share.append((row["global_batch"] / row["samples_per_s"] - exposed) / self.t1(b))
                priced, _ = ring_allreduce(fits, backend, row["env_device"], int(n), row["grad_bytes"])
                hidden.append(exposed / priced if priced > 0 else 0.0)
            self.calibrated[(backend, int(n))] = {
                "share": float(np.median(share)),
                "hidden": float(np.median(hidden)),
                "settings": len(rows),
            }

    def t1(self, b: float) -> float:
        return self.single.get(float(b), self.a + self.c * b)

    def forecast(self, backend: str, device: str, n: int, global_batch: int, grad_bytes: float) -> dict:
        """Throughput and speedup of DDP over n ranks at `global_batch`, with how it was reached."""
        b = global_batch / n
        mine = [k for k in self.calibrated if k[0] == backend]
        if not mine:
            raise LookupError(f"no measured DDP setting over {backend} calibrates it")
        if (backend, n) in self.calibrated:
            cal, how_n = self.calibrated[(backend, n)], None
            share = cal["share"]
        else:
            largest = max(mine, key=lambda k: k[1])
            grow = (self.calibrated[largest]["share"] - 1) / max(largest[1] - 1, 1)
            share = 1 + grow * (n - 1)
            nearest = min(mine, key=lambda k: abs(k[1] - n))
            cal, how_n = self.calibrated[nearest], nearest[1]
        allreduce, comm_extrapolated = ring_allreduce(self.fits, backend, device, n, grad_bytes)
        step = self.t1(b) * share + cal["hidden"] * allreduce
        outside_b = not (self.batches[0] <= b <= self.batches[-1])
        basis = [
            f"{len(self.single)} single-device batch(es)",
            f"{cal['settings']} DDP setting(s) at n={n if how_n is None else how_n}",
        ]
        if how_n is not None:
            basis.append(f"{n} ranks extrapolated from {how_n}")
        if outside_b:
            basis.append(f"per-device batch {b:g} outside the measured {self.batches[0]:g}-{self.batches[-1]:g}")
        if comm_extrapolated and how_n is None:
            basis.append(f"the gradient's {grad_bytes:,.0f} bytes outside comm_bench's sizes")
        extrapolated = how_n is not None or outside_b or comm_extrapolated
        distance = 0.0
        if how_n is not None:
            distance += abs(math.log2(n / how_n))
        if outside_b:
            distance += min(abs(math.log2(b / self.batches[0])), abs(math.log2(b / self.batches[-1])))
        return {
            "predicted_samples_per_s": global_batch / step,
            "predicted_memory_mb": self.memory.at(b),
            "predicted_speedup": self.t1(global_batch) / step,
            "how": "extrapolated" if extrapolated else "interpolated",
            "basis": "; ".join(basis),
            "distance": distance,
        }


def interval(predicted: float, sigma: float, distance: float) -> tuple[float, float]:
    """The 95 % interval around a forecast: log-normal, sigma widened by the extrapolation's distance."""
    spread = Z95 * sigma * (1 + distance)
    return predicted * math.exp(-spread), predicted * math.exp(spread)
