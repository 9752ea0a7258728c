"""Forecasts of DDP and FSDP settings from the measured ones, each checked against a setting held out.

Per forecast group (every setting key but the strategy and batch keys, compile kept: FORECAST_GROUP),
from the study's own settings table, cells' probes and the collectives' fits (dpstudy.analysis.comm_fit).
A scheme is which collectives a step makes (a key of MESSAGES: ddp, fsdp full, fsdp grad_op):

  t1(b)       a single-device step at batch b: b / its measured throughput; elsewhere the line
              a + c b through the measured batches (least squares; one batch: c b), on CUDA
              sqrt(a^2 + (c b)^2), where the host's launches overlap the device's work
              (dpstudy.analysis.linefit.StepTime)
  comm(n)     the scheme's collectives per step, each message priced by its fit at n ranks
              (latency + bytes / bandwidth): DDP all-reduces the gradient in `buckets`; FSDP
              all-gathers each of its `units` (twice when shard is full: for forward and again
              for backward, once for grad_op) and reduce-scatters its gradients (the probes'
              layout, dpstudy.engine.grad_layout)
  exposed     the communication backward did not hide, per step: the probe's step minus the same
              step without it (DDP under no_sync; FSDP on an unsharded replica), the median of
              the rounds in which the two took turns (exposed_s; older probes: the two means)
  share(n)    how much slower one rank's step is when n ranks share the host:
              (the measured step - exposed) / t1(b), median over the calibrating settings at n
  hidden(n)   exposed / comm(n): the part of the priced communication left exposed
  step(n, b)  t1(b) share(n) + hidden(n) comm(n)
  throughput  B / step(n, B / n) for a global batch B; speedup over t1's throughput at B

share and hidden come from the scheme's own measured settings; an FSDP scheme none of whose
settings ran borrows DDP's (the same ranks on the same host, the same backend), and says so. World
sizes without a calibrating setting extrapolate: share grows linearly from 1 at one rank through the
largest calibrated n, hidden is the nearest n's, and each collective follows the ring from the fit
at the nearest world size (latency x (n - 1), bytes x its bus factor over the bus bandwidth). Each
forecast says which (`how`: interpolated or extrapolated, `basis`).

Memory per device: dpstudy.analysis.memory_forecast's line in the per-device batch, plus on CUDA
the median of what the allocator held beyond the tracked step (`outside`: workspaces, resident
data, buckets), so that it forecasts max_memory_allocated. The 95 %
interval of a forecast is exp(+-1.96 sigma) around it, sigma the model's log error on settings held
out (dpstudy.analysis.forecast_table, which makes the table), widened by 1 + the log2-distance to the
calibrated world sizes and batches when extrapolating, and by one more where an FSDP scheme
borrows DDP's share and overlap.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dpstudy.analysis.comm_fit import predicted_time
from dpstudy.analysis.keys import SETTING_KEYS
from dpstudy.analysis.linefit import StepTime
from dpstudy.analysis.memory_forecast import MemoryLine
from dpstudy.analysis.strategies import STRATEGY_KEYS
from dpstudy.util.busfactors import bus_factor

BATCH_KEYS = ("batch", "global_batch", "devices")
# compile stays in the forecast group though the strategies table counts it a strategy key: a compiled
# step is not an eager one, so each calibrates only on cells of its own kind
FORECAST_GROUP = tuple(k for k in SETTING_KEYS if k == "compile" or k not in (*STRATEGY_KEYS, *BATCH_KEYS))
Z95 = 1.96
# Per scheme, its collectives per step: (collective, the layout's message count, its bytes)
MESSAGES = {
    "ddp": (("all_reduce", "buckets", "grad_bytes"),),
    "fsdp full": (
        ("all_gather", "units", "gather_bytes"),
        ("all_gather", "units", "gather_bytes"),
        ("reduce_scatter", "units", "grad_bytes"),
    ),
    "fsdp grad_op": (("all_gather", "units", "gather_bytes"), ("reduce_scatter", "units", "grad_bytes")),
}
# FSDP's all-gather moves the parameters in the compute dtype of its mixed-precision policy
GATHER_SHARE = {"fp32": 1.0, "bf16": 0.5, "fp16": 0.5}


def scheme_of(mode: str, shard) -> str:
    """The key of MESSAGES for a setting's mode and shard (an FSDP setting without one shards full);
    fsdp hybrid has none: the model does not price HSDP's two-level collectives, so its settings
    neither calibrate nor are forecast (forecast_table.calibration_inputs; a request says why)."""
    return f"fsdp {shard if shard in ('full', 'grad_op', 'hybrid') else 'full'}" if mode == "fsdp" else mode


def collective_time(
    fits: pd.DataFrame, collective: str, backend: str, device: str, n: int, nbytes: float, messages: int = 1
) -> tuple[float, bool]:
    """(seconds of `messages` equal calls of `collective` moving `nbytes` in all over n ranks, whether
    it extrapolated): the fit at n within its sizes, else the ring from the nearest world size's fit."""
    rows = fits[(fits["collective"] == collective) & (fits["backend"] == backend) & (fits["device"] == device)]
    if rows.empty:
        raise LookupError(f"no {collective} fit for {backend} on {device} (comm_bench)")
    near = rows.iloc[(rows["world_size"] - n).abs().argsort()].iloc[0]
    m, each = int(near["world_size"]), nbytes / max(messages, 1)
    if m == n:
        return messages * predicted_time(near, each), not near["min_bytes"] <= each <= near["max_bytes"]
    # the ring's bytes per rank (the bus factor) carry a fit at m ranks to n ranks
    per_hop = near["latency_s"] / max(m - 1, 1)
    busbw = near["bandwidth_gbps"] * 1e9 * bus_factor(collective, m)
    return messages * (per_hop * (n - 1) + each * bus_factor(collective, n) / busbw), True


def layout_of(multi: pd.DataFrame) -> dict[str, float]:
    """The forecast group's gradient layout (medians over its DDP and FSDP settings): grad_bytes, buckets,
    units, gather_bytes. A probe that did not record a count (older records) counts one message."""
    if multi.empty:
        return {"grad_bytes": math.nan, "buckets": 1, "units": 1, "gather_bytes": math.nan}
    grad = float(multi["grad_bytes"].median())
    share = multi["precision"].map(GATHER_SHARE).fillna(1.0) if "precision" in multi else 1.0
    gather = multi.get("gather_bytes", pd.Series(math.nan, index=multi.index)).fillna(multi["grad_bytes"] * share)

    def count(column: str) -> int:
        values = multi[column].dropna() if column in multi else pd.Series(dtype=float)
        return int(values.median()) if len(values) else 1

    return {"grad_bytes": grad, "buckets": count("buckets"), "units": count("units"), "gather_bytes": gather.median()}


class Calibration:
    """The calibrated model of one forecast group (one FORECAST_GROUP value): `single` its
    single-device settings, `multi` its DDP and FSDP settings over 2+ ranks with their probes and
    `scheme` (scheme_of)."""

    def __init__(self, single: pd.DataFrame, multi: pd.DataFrame, fits: pd.DataFrame):
        self.batches = sorted(single["global_batch"].astype(float))
        self.single = dict(zip(single["global_batch"].astype(float), single["global_batch"] / single["samples_per_s"]))
        # CUDA: the host's launches and the device's work overlap (linefit.StepTime)
        overlapped = bool((single["env_device"] == "cuda").all()) if "env_device" in single else False
        self.step_time = StepTime.fit(self.single, self.single.values(), overlapped)
        self.fits = fits
        self.layout = layout_of(multi)
        # memory_mb: the settings' step peak (dpstudy.analysis.memory_forecast), NaN where not measured
        self.memory = MemoryLine(
            list(zip(single["global_batch"].astype(float), single["memory_mb"], strict=True)),
            [
                (s, b / n, n, mb)
                for s, b, n, mb in zip(multi["scheme"], multi["global_batch"], multi["devices"], multi["memory_mb"])
            ],
        )
        # the allocator's peak beyond the tracker's (CUDA): added unsharded to every memory forecast
        outside = pd.concat([frame.get("outside_mb", pd.Series(dtype=float)) for frame in (single, multi)]).dropna()
        self.outside = float(outside.median()) if len(outside) else 0.0
        self.calibrated: dict[tuple[str, str, int], dict] = {}
        for (scheme, backend, n), rows in multi.groupby(["scheme", "backend", "devices"]):
            share, hidden = [], []
            for _, row in rows.iterrows():
                exposed = row.get("exposed_s", math.nan)
                exposed = max(0.0, row["sync_step_s"] - row["nosync_step_s"] if pd.isna(exposed) else exposed)
                share.append((row["global_batch"] / row["samples_per_s"] - exposed) / self.t1(row["global_batch"] / n))
                priced, _ = self.comm(scheme, backend, row["env_device"], int(n))
                hidden.append(exposed / priced if priced > 0 else 0.0)
            self.calibrated[(scheme, backend, int(n))] = {
                "share": float(np.median(share)),
                "hidden": float(np.median(hidden)),
                "settings": len(rows),
            }

    def t1(self, b: float) -> float:
        return self.single.get(float(b), self.step_time(b))

    def comm(self, scheme: str, backend: str, device: str, n: int) -> tuple[float, bool]:
        """(seconds of the scheme's collectives per step at n ranks, whether any extrapolated)."""
        total, outside = 0.0, False
        for collective, count, size in MESSAGES[scheme]:
            seconds, out = collective_time(
                self.fits, collective, backend, device, n, self.layout[size], self.layout[count]
            )
            total, outside = total + seconds, outside or out
        return total, outside

    def forecast(self, scheme: str, backend: str, device: str, n: int, global_batch: int) -> dict:
        """Throughput, speedup and memory per device of `scheme` over n ranks at `global_batch`,
        with how it was reached."""
        if scheme not in MESSAGES:
            raise LookupError(f"{scheme} is not forecast (the model forecasts {', '.join(MESSAGES)})")
        b = global_batch / n
        source = scheme
        if not any(k[:2] == (scheme, backend) for k in self.calibrated):
            source = "ddp"  # an FSDP scheme none of whose settings ran: DDP's share and overlap
        mine = [k for k in self.calibrated if k[:2] == (source, backend)]
        if not mine:
            kinds = "DDP" if scheme == "ddp" else f"{scheme.replace('fsdp', 'FSDP')} or DDP"
            raise LookupError(f"no measured {kinds} setting over {backend} calibrates it")
        if (source, backend, n) in self.calibrated:
            cal, how_n = self.calibrated[(source, backend, n)], None
            share = cal["share"]
        else:
            largest = max(mine, key=lambda k: k[2])
            grow = (self.calibrated[largest]["share"] - 1) / max(largest[2] - 1, 1)
            share = 1 + grow * (n - 1)
            nearest = min(mine, key=lambda k: abs(k[2] - n))
            cal, how_n = self.calibrated[nearest], nearest[2]
        comm, comm_extrapolated = self.comm(scheme, backend, device, n)
        step = self.t1(b) * share + cal["hidden"] * comm
        outside_b = not (self.batches[0] <= b <= self.batches[-1])
        label = source.replace("ddp", "DDP").replace("fsdp", "FSDP")
        basis = [
            f"{len(self.single)} single-device batch(es)",
            f"{cal['settings']} {label} setting(s) at n={n if how_n is None else how_n}",
        ]
        if source != scheme:
            basis.append(f"no {scheme} setting ran: DDP's host share and overlap")
        if how_n is not None:
            basis.append(f"{n} ranks extrapolated from {how_n}")
        if outside_b:
            basis.append(f"per-device batch {b:g} outside the measured {self.batches[0]:g}-{self.batches[-1]:g}")
        if comm_extrapolated and how_n is None:
            basis.append("messages outside comm_bench's sizes")
        extrapolated = how_n is not None or outside_b or comm_extrapolated or source != scheme
        distance = 0.0
        if how_n is not None:
            distance += abs(math.log2(n / how_n))
        if outside_b:
            distance += min(abs(math.log2(b / self.batches[0])), abs(math.log2(b / self.batches[-1])))
        if source != scheme:
            distance += 1  # another scheme's overlap: as uncertain as a doubling of the world size
        return {
            "predicted_samples_per_s": global_batch / step,
            "predicted_memory_mb": self.memory.at(b, n, scheme) + self.outside,
            "predicted_speedup": self.t1(global_batch) / step,
            "how": "extrapolated" if extrapolated else "interpolated",
            "basis": "; ".join(basis),
            "distance": distance,
        }


def interval(predicted: float, sigma: float, distance: float) -> tuple[float, float]:
    """The 95 % interval around a forecast: log-normal, sigma widened by the extrapolation's distance."""
    spread = Z95 * sigma * (1 + distance)
    return predicted * math.exp(-spread), predicted * math.exp(spread)
