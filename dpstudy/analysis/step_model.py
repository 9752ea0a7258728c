"""One model of a data-parallel training step: the forecasts are it at settings that did not run
(dpstudy.analysis.calibration) and "why not n x" is its breakdown at the ones that did
(dpstudy.analysis.scaling).

A step of a scheme (dpstudy.study.modes: a mode and its shard) over n ranks at per-device batch b:

  step(n, b) = t1(b) + sharing + fixed + exposed + data + transfers, in seconds, where
    t1(b)      one device's step at the per-device batch without its waiting for data (forward,
               backward, the optimizer, the loop): measured where it ran, else the line through the
               measured single-device batches (dpstudy.analysis.linefit.StepTime)
    sharing    (share(n) - 1) t1(b): that step slowed down by n ranks sharing a host (cores, memory
               bandwidth, on a GPU server the host that feeds the devices)
    fixed      fixed(n): what the strategy adds to every step whatever the batch (DDP's hooks and
               bucket copies, FSDP's unshard and reshard copies)
    exposed    comm(n) (1 - overlap(n)): the scheme's collectives per step, each bucket or unit
               priced by its comm_fit line (dpstudy.analysis.comm_fit), less the share the step hides;
               overlap is below 0 where the collectives ran slower beside compute than alone
    data       the step's own waiting for data
    transfers  DP's scatter, replicate and gather

share, fixed and overlap are calibrated per (scheme, backend, n) on the measured settings
(`calibrate`): overlap is 1 - the measured exposed communication / comm(n) (which measurement:
dpstudy.analysis.step_inputs.EXPOSED_FROM); share and fixed are the line through the settings'
remainders (step - t1 - exposed - data - transfers against t1, robust to an odd setting), the
share alone where one batch ran.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dpstudy.analysis.comm_fit import predicted_time
from dpstudy.study import modes
from dpstudy.util.busfactors import bus_factor

# Per priced scheme, its collectives per step as the modes' table states them: (collective, the
# layout's message count, its bytes); the other schemes (DP's transfers, HSDP's two levels) calibrate
# their breakdown but are never forecast
MESSAGES = {
    name: tuple((c.op, c.count, c.size) for c in modes.of_scheme(name)[1].collectives)
    for name in modes.priced_schemes()
}
# FSDP's all-gather moves the parameters in the compute dtype of its mixed-precision policy
GATHER_SHARE = {"fp32": 1.0, "bf16": 0.5, "fp16": 0.5}
# the parts of a step, in the order they add up (Step.parts)
PARTS = ("t1_s", "sharing_s", "fixed_s", "exposed_s", "data_s", "transfers_s")


@dataclass(frozen=True)
class Step:
    """One step's parts in seconds (the module's docstring); `comm_s` what the collectives cost
    alone, of which `exposed_s` the step did not hide."""

    t1_s: float
    sharing_s: float
    fixed_s: float
    exposed_s: float
    data_s: float = 0.0
    transfers_s: float = 0.0
    comm_s: float = math.nan

    @property
    def total_s(self) -> float:
        return float(np.nansum([getattr(self, part) for part in PARTS]))

    @property
    def overlap(self) -> float:
        return 1 - self.exposed_s / self.comm_s if self.comm_s > 0 else math.nan


def step(t1_s: float, share: float, fixed_s: float, comm_s: float, overlap: float, **rest) -> Step:
    """The step at per-device batch b from its calibrated parts: `t1_s` one device's step at b,
    `comm_s` the priced collectives and the `overlap` that hides them; `rest`: data_s, transfers_s."""
    return Step(t1_s, (share - 1) * t1_s, fixed_s, comm_s * (1 - overlap), comm_s=comm_s, **rest)


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


def comm_time(fits: pd.DataFrame, scheme: str, layout: dict, backend: str, device: str, n: int) -> tuple[float, bool]:
    """(seconds of the scheme's collectives per step at n ranks, whether any extrapolated); LookupError
    for a scheme the model does not price or a collective without a fit."""
    if scheme not in MESSAGES:
        raise LookupError(f"{scheme} is not priced (the model prices {', '.join(MESSAGES)})")
    total, outside = 0.0, False
    for collective, count, size in MESSAGES[scheme]:
        seconds, out = collective_time(fits, collective, backend, device, n, layout[size], layout[count])
        total, outside = total + seconds, outside or out
    return total, outside


def layout_of(multi: pd.DataFrame) -> dict[str, float]:
    """The forecast group's gradient layout (medians over its DDP and FSDP settings): grad_bytes, buckets,
    units, gather_bytes. A probe that did not record a count (older records) counts one message."""
    multi = multi[multi["grad_bytes"].notna()] if "grad_bytes" in multi else multi.iloc[0:0]
    if multi.empty:
        return {"grad_bytes": math.nan, "buckets": 1, "units": 1, "gathers": 1, "gather_bytes": math.nan}
    grad = float(multi["grad_bytes"].median())
    share = multi["precision"].map(GATHER_SHARE).fillna(1.0) if "precision" in multi else 1.0
    gather = multi.get("gather_bytes", pd.Series(math.nan, index=multi.index)).fillna(multi["grad_bytes"] * share)

    def count(column: str) -> int:
        values = multi[column].dropna() if column in multi else pd.Series(dtype=float)
        return int(values.median()) if len(values) else 1

    counts = {name: count(name) for name in ("buckets", "units", "gathers")}
    return {"grad_bytes": grad, **counts, "gather_bytes": gather.median()}


def calibrate(t1s: list[float], remainders: list[float], overlaps: list[float]) -> dict:
    """share, fixed and overlap of one (scheme, backend, n) from its settings: `t1s` their t1(b),
    `remainders` their step - t1 - exposed - data - transfers, `overlaps` their measured overlap (NaN
    where unpriced). Two or more batches: the line remainder = (share - 1) t1 + fixed, by Siegel's
    repeated median (per setting the median of its slopes to the others, their median, then the
    intercepts' median: one odd setting among four or more does not move it). A share below 1 or a
    fixed cost below 0 is kept as measured, not forced to a physical value: it says that the
    measurements it rests on disagree (an exposed time the probe overstated), and the report marks
    a negative part within the step's noise as noise. One batch cannot tell the two apart: the
    remainder is taken as the host's share (the median of remainder / t1), no fixed cost, which
    forecast the other batches of benchmarks/prediction_accuracy.py's DDP settings better than a
    fixed cost did. The overlap is the settings' median."""
    x, y = np.asarray(t1s, float), np.asarray(remainders, float)
    share, fixed = 1.0, float(np.median(y)) if len(y) else math.nan
    if len(x) and (x > 0).all():
        share, fixed = 1 + float(np.median(y / x)), 0.0
    per_point = [
        np.median([(y[j] - y[i]) / (x[j] - x[i]) for j in range(len(x)) if x[j] != x[i]])
        for i in range(len(x))
        if (x != x[i]).any()
    ]
    if per_point:
        slope = float(np.median(per_point))
        share, fixed = 1 + slope, float(np.median(y - slope * x))
    priced = [o for o in overlaps if not math.isnan(o)]
    return {
        "share": share,
        "fixed_s": fixed,
        "overlap": float(np.median(priced)) if priced else math.nan,
        "settings": len(x),
    }
