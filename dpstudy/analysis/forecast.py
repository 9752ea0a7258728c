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

Requested forecasts (the study's `predict:` block, dpstudy.study.predict) use every measured setting
of the workload. Leave-one-out: every measured DDP setting is forecast from the others (its own cells are not read),
which is the model's error on this study; the 95 % interval of a forecast is exp(+-1.96 sigma) around
it, sigma the RMS of those log errors (at least the settings' own noise), widened by 1 + the
log2-distance to the calibrated world sizes and batches when extrapolating.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import pandas as pd

from dpstudy.analysis.comm_fit import predicted_time
from dpstudy.analysis.keys import SETTING_KEYS
from dpstudy.analysis.strategies import STRATEGY_KEYS

BATCH_KEYS = ("batch", "global_batch", "devices")
FORECAST_GROUP = tuple(k for k in SETTING_KEYS if k not in (*STRATEGY_KEYS, *BATCH_KEYS))
Z95 = 1.96
PROBES = ("sync_step_s", "nosync_step_s", "grad_bytes")  # the DDP probe's fields a forecast reads
COLUMNS = (
    *FORECAST_GROUP,
    "mode",
    "backend",
    "devices",
    "global_batch",
    "predicted_samples_per_s",
    "predicted_low",
    "predicted_high",
    "predicted_speedup",
    "how",
    "basis",
    "source",
    "measured_samples_per_s",
    "error",
)


def line_fit(batches: Iterable[float], step_s: Iterable[float]) -> tuple[float, float]:
    """(a, c) of step = a + c b by least squares; one batch: (0, step / b). Neither below 0."""
    b, t = np.asarray(list(batches), float), np.asarray(list(step_s), float)
    if len(b) == 1 or np.ptp(b) == 0:
        return 0.0, float(np.mean(t / b))
    c, a = np.polyfit(b, t, 1)
    if a < 0 or c < 0:  # a noisy pair that would put the fixed cost below zero: through the origin
        return 0.0, float(np.sum(b * t) / np.sum(b * b))
    return float(a), float(c)


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
            "predicted_speedup": self.t1(global_batch) / step,
            "how": "extrapolated" if extrapolated else "interpolated",
            "basis": "; ".join(basis),
            "distance": distance,
        }


def interval(predicted: float, sigma: float, distance: float) -> tuple[float, float]:
    """The 95 % interval around a forecast: log-normal, sigma widened by the extrapolation's distance."""
    spread = Z95 * sigma * (1 + distance)
    return predicted * math.exp(-spread), predicted * math.exp(spread)


def calibration_inputs(settings: pd.DataFrame, cells: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(single-device settings, DDP settings over 2+ ranks with the medians of their cells' probes)."""
    single = settings[(settings["mode"] == "single") & (settings["devices"] == 1)]
    ddp = settings[(settings["mode"] == "ddp") & (settings["devices"] > 1)].copy()
    probes = cells.set_index("cell")[list(PROBES)]
    for column in PROBES:  # the setting's `cells`: its finished repeats, space-separated
        ddp[column] = [probes.loc[ids.split(), column].median() for ids in ddp["cells"]]
    return single, ddp[ddp[list(PROBES)].notna().all(axis=1)]


def group_of(frame: pd.DataFrame, key: tuple) -> pd.DataFrame:
    if frame.empty:
        return frame
    mask = np.ones(len(frame), bool)
    for column, value in zip(FORECAST_GROUP, key, strict=True):
        mask &= (frame[column] == value).to_numpy() | (frame[column].isna().to_numpy() & pd.isna(value))
    return frame[mask]


def leave_one_out(settings: pd.DataFrame, cells: pd.DataFrame, fits: pd.DataFrame) -> pd.DataFrame:
    """The `predictions` table's measured rows: every DDP setting over 2+ ranks forecast from the
    workload's other settings (its own never read), beside what it measured; `error` is
    predicted / measured - 1 (and `noise_cv`, the setting's own, which the interval cannot beat). A
    setting no other calibrates is left out."""
    single, ddp = calibration_inputs(settings, cells)
    rows = []
    for key, own in ddp.groupby(list(FORECAST_GROUP), dropna=False, sort=True):
        singles = group_of(single, key)
        if singles.empty:
            continue
        for index, held_out in own.iterrows():
            try:
                model = Workload(singles, own.drop(index), fits)
                made = model.forecast(
                    held_out["backend"],
                    held_out["env_device"],
                    int(held_out["devices"]),
                    int(held_out["global_batch"]),
                    held_out["grad_bytes"],
                )
            except LookupError:
                continue
            rows.append(
                {
                    **dict(zip(FORECAST_GROUP, key, strict=True)),
                    **{k: held_out[k] for k in ("mode", "backend", "devices", "global_batch")},
                    **made,
                    "source": "leave-one-out",
                    "measured_samples_per_s": held_out["samples_per_s"],
                    "error": made["predicted_samples_per_s"] / held_out["samples_per_s"] - 1,
                    "noise_cv": held_out["noise_cv"],
                }
            )
    table = pd.DataFrame(rows)
    if table.empty:
        return pd.DataFrame(columns=list(COLUMNS))
    sigma = model_sigma(table["error"], table["noise_cv"])
    bounds = [interval(p, sigma, d) for p, d in zip(table["predicted_samples_per_s"], table["distance"], strict=True)]
    table["predicted_low"], table["predicted_high"] = zip(*bounds, strict=True)
    return table[[*COLUMNS, "noise_cv"]]


def model_sigma(errors: pd.Series, noise_cv: pd.Series) -> float:
    """The log-scale spread of a forecast: the RMS of the leave-one-out log errors, never below the
    settings' own median noise (a model cannot be checked to better than its inputs scatter)."""
    logs = np.log1p(errors.astype(float))
    rms = float(np.sqrt(np.mean(logs**2))) if len(logs) else math.nan
    noise = float(np.nanmedian(noise_cv)) if noise_cv.notna().any() else 0.0
    return float(np.nanmax([rms, noise]))


def requested(
    settings: pd.DataFrame, cells: pd.DataFrame, fits: pd.DataFrame, requests: list[dict], sigma: float
) -> pd.DataFrame:
    """The `predictions` table's forecast rows: every request (dpstudy.study.predict.requests) for
    every workload with measured DDP settings its filters match, calibrated on all of them; a
    request the workload cannot answer (no DDP setting over its backend, no all-reduce fit) is a
    row with the reason as its basis and no numbers. `sigma`: the log spread of leave_one_out's errors."""
    single, ddp = calibration_inputs(settings, cells)
    rows = []
    for key, own in ddp.groupby(list(FORECAST_GROUP), dropna=False, sort=True) if requests else []:
        group = dict(zip(FORECAST_GROUP, key, strict=True))
        singles = group_of(single, key)
        if singles.empty:
            continue
        try:  # no all-reduce fit (bench comm: false): every request of the workload says so
            model, unfit = Workload(singles, own, fits), None
        except LookupError as error:
            model, unfit = None, str(error)
        for request in requests:
            if any(request[k] is not None and group[k] not in request[k] for k in ("dataset", "model")):
                continue
            row = {**group, **{k: request[k] for k in ("mode", "backend")}, "source": "predict"}
            row.update(devices=request["gpus"], global_batch=request["batch"])
            try:  # no DDP setting over the request's backend: say so
                if model is None:
                    raise LookupError(unfit)
                made = model.forecast(
                    request["backend"],
                    group["env_device"],
                    request["gpus"],
                    request["batch"],
                    own["grad_bytes"].median(),
                )
            except LookupError as error:
                rows.append({**row, "how": "not forecast", "basis": str(error)})
                continue
            low, high = interval(made["predicted_samples_per_s"], sigma, made["distance"])
            rows.append({**row, **made, "predicted_low": low, "predicted_high": high})
    return pd.DataFrame(rows, columns=list(COLUMNS))


def predictions(settings: pd.DataFrame, cells: pd.DataFrame, fits: pd.DataFrame, requests: list[dict]) -> pd.DataFrame:
    """The `predictions` table: leave_one_out's rows, then the requested forecasts."""
    held_out = leave_one_out(settings, cells, fits)
    if held_out.empty:  # nothing held out to check the model on: the settings' own noise alone
        sigma = model_sigma(pd.Series(dtype=float), settings.get("noise_cv", pd.Series(dtype=float)))
    else:
        sigma = model_sigma(held_out["error"], held_out["noise_cv"])
    forecasts = requested(settings, cells, fits, requests, sigma)
    frames = [frame for frame in (held_out[list(COLUMNS)], forecasts) if not frame.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(COLUMNS))
