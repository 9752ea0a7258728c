"""The step model calibrated on a study's measured settings: what the breakdown ("why not n x",
dpstudy.analysis.scaling) and the forecasts (dpstudy.analysis.forecast_table) of every priced scheme
share, each forecast checked against a setting held out.

Per forecast group (every setting key but the strategy and batch keys, compile kept: FORECAST_GROUP),
from the study's own settings table, the cells' traces and probes (dpstudy.analysis.step_inputs) and
the collectives' fits (dpstudy.analysis.comm_fit), `Calibration` calibrates the step model
(dpstudy.analysis.step_model: one device's step t1(b), the host's share, the strategy's fixed cost,
the collectives priced per bucket or unit and the overlap that hides them) and forecasts a setting as
that model's step:

  t1(b)       a single-device step at batch b without its waiting for data: b / its measured
              throughput - its data wait per step; elsewhere the line a + c b through the measured
              batches (least squares; one batch: c b), on CUDA sqrt(a^2 + (c b)^2), where the host's
              launches overlap the device's work (dpstudy.analysis.linefit.StepTime)
  throughput  B / step(n, B / n) for a global batch B; speedup over one device's step at B

share, fixed and overlap come from the scheme's own measured settings; an FSDP scheme none of whose
settings ran borrows DDP's (the same ranks on the same host, the same backend), and says so. World
sizes without a calibrating setting extrapolate: share grows linearly from 1 at one rank through the
largest calibrated n, fixed and overlap are the nearest n's, and each collective follows the ring from
the fit at the nearest world size (latency x (n - 1), bytes x its bus factor over the bus bandwidth).
Each forecast says which (`how`: interpolated or extrapolated, `basis`).

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

from dpstudy.analysis.keys import FORECAST_GROUP
from dpstudy.analysis.linefit import StepTime
from dpstudy.analysis.memory_forecast import MemoryLine, held_memory, outside_tracker, setting_memory, setting_state
from dpstudy.analysis.step_inputs import cell_parts, setting_parts
from dpstudy.analysis.step_model import MESSAGES, calibrate, comm_time, layout_of, step
from dpstudy.study import modes

Z95 = 1.96


PROBES = ("grad_bytes",)  # what a forecast needs of a setting's probe beyond its exposed communication
# and what it reads where recorded (older probes lack them): the layout
OPTIONAL = ("buckets", "units", "gather_bytes", "gathers")


def calibration_inputs(
    settings: pd.DataFrame,
    cells: pd.DataFrame,
    split: pd.DataFrame | None = None,
    epochs: pd.DataFrame | None = None,
    schemes=tuple(MESSAGES),
    parts: pd.DataFrame | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(single-device settings, settings over 2+ ranks of `schemes` with their `scheme`
    (dpstudy.study.modes.scheme_name), the medians of their cells' probes and the step model's parts
    (dpstudy.analysis.step_inputs.setting_parts: exposed communication from the probes or the traces
    as step_inputs.EXPOSED_FROM orders them, waiting for data per step from `epochs`, none without
    them)). Both carry `memory_mb`,
    the tracker's peak, `outside_mb`, what a CUDA allocator held beyond it, and `held_mb`, their sum
    (dpstudy.analysis.memory_forecast.setting_memory over `split`, the memory_split table; NaN without
    it). A setting without a measured exposed communication (DP excepted) does not calibrate.
    `parts`: cell_parts(cells, epochs) where the caller made them already."""
    settings = settings.assign(
        **setting_state(settings, split),
        memory_mb=setting_memory(settings, split),
        outside_mb=outside_tracker(settings, split),
        held_mb=held_memory(settings, split),
    )
    settings = setting_parts(settings, cell_parts(cells, epochs) if parts is None else parts)
    single = settings[(settings["mode"] == modes.BASELINE) & (settings["devices"] == 1)]
    multi = settings[~settings["mode"].isin([modes.BASELINE]) & (settings["devices"] > 1)].copy()
    shard = multi["shard"] if "shard" in multi else pd.Series(None, index=multi.index, dtype=object)
    multi["scheme"] = [modes.scheme_name(m, s) for m, s in zip(multi["mode"], shard, strict=True)]
    multi = multi[multi["scheme"].isin(schemes) & multi["exposed_step_s"].notna() & multi["transfers_s"].notna()]
    columns = [c for c in (*PROBES, *OPTIONAL) if c in cells]
    probes = cells.set_index("cell")[columns]
    for column in columns:  # the setting's `cells`: its finished repeats, space-separated
        multi[column] = [probes.loc[ids.split(), column].median() for ids in multi["cells"]]
    # a priced scheme needs its gradients' bytes to price its collectives
    probed = multi[list(PROBES)].notna().all(axis=1) if set(PROBES) <= set(columns) else False
    return single, multi[~multi["scheme"].isin(MESSAGES) | probed]


def group_of(frame: pd.DataFrame, key: tuple) -> pd.DataFrame:
    if frame.empty:
        return frame
    mask = np.ones(len(frame), bool)
    for column, value in zip(FORECAST_GROUP, key, strict=True):
        mask &= (frame[column] == value).to_numpy() | (frame[column].isna().to_numpy() & pd.isna(value))
    return frame[mask]


class Calibration:
    """The step model (dpstudy.analysis.step_model) calibrated on one forecast group (one
    FORECAST_GROUP value): `single` its single-device settings, `multi` its settings over 2+ ranks
    with their `scheme` (step_model.scheme_of) and parts (dpstudy.analysis.step_inputs.setting_parts;
    calibration_inputs makes both). Only MESSAGES' schemes are forecast; the others
    (DP, HSDP) calibrate their own breakdown."""

    def __init__(self, single: pd.DataFrame, multi: pd.DataFrame, fits: pd.DataFrame):
        self.batches = sorted(single["global_batch"].astype(float))
        waits = single.get("data_step_s", pd.Series(0.0, index=single.index)).fillna(0.0)
        steps = single["global_batch"] / single["samples_per_s"] - waits
        self.single = dict(zip(single["global_batch"].astype(float), steps))
        # one device's waiting for data per step, which a one-device forecast adds back
        self.data_s = float(waits.median()) if len(waits) else 0.0
        # CUDA: the host's launches and the device's work overlap (linefit.StepTime)
        overlapped = bool((single["env_device"] == "cuda").all()) if "env_device" in single else False
        self.step_time = StepTime.fit(self.single, self.single.values(), overlapped)
        self.fits = fits
        priced = multi[multi["scheme"].isin(MESSAGES)]
        # each layout's own settings (modes.ModeFacts.layout): ZeRO's counted messages are not DDP's
        # buckets; a layout none of whose settings ran reads the group's
        self.layout = layout_of(priced)
        families = priced["scheme"].map(layout_family) if len(priced) else pd.Series(dtype=object)
        self.layouts = {family: layout_of(rows) for family, rows in priced.groupby(families)}
        # memory_mb: the settings' step peak (dpstudy.analysis.memory_forecast), NaN where not measured
        self.memory = MemoryLine(
            list(zip(single["global_batch"].astype(float), single["memory_mb"], strict=True)),
            [
                (s, b / n, n, mb)
                for s, b, n, mb in zip(priced["scheme"], priced["global_batch"], priced["devices"], priced["memory_mb"])
            ],
            state_of(single),
        )
        # the allocator's peak beyond the tracker's (CUDA): added unsharded to every memory forecast
        outside = pd.concat([frame.get("outside_mb", pd.Series(dtype=float)) for frame in (single, priced)]).dropna()
        self.outside = float(outside.median()) if len(outside) else 0.0
        self.calibrated: dict[tuple[str, str, int], dict] = {}
        for (scheme, backend, n), rows in multi.groupby(["scheme", "backend", "devices"]):
            self.calibrated[(scheme, backend, int(n))] = self.calibrate(scheme, backend, int(n), rows)

    def calibrate(self, scheme: str, backend: str, n: int, rows: pd.DataFrame) -> dict:
        """share, fixed, overlap (step_model.calibrate), data and transfers of one (scheme, backend, n)."""
        t1s, remainders, overlaps = [], [], []
        for _, row in rows.iterrows():
            b = row["global_batch"] / n
            exposed = row["exposed_step_s"]
            parts = exposed + row["data_step_s"] + row["transfers_s"]
            remainders.append(row["global_batch"] / row["samples_per_s"] - self.t1(b) - parts)
            t1s.append(self.t1(b))
            try:
                priced, _ = self.comm(scheme, backend, row["env_device"], n)
            except LookupError:  # no fit (bench comm: false), or a scheme the model does not price
                priced = math.nan
            overlaps.append(1 - exposed / priced if priced > 0 else math.nan)
        cal = calibrate(t1s, remainders, overlaps)
        return {
            **cal,
            "data_s": float(rows["data_step_s"].median()),
            "transfers_s": float(rows["transfers_s"].median()),
        }

    def t1(self, b: float) -> float:
        """One device's step at batch b without its waiting for data: measured where it ran."""
        return self.single.get(float(b), self.step_time(b))

    def comm(self, scheme: str, backend: str, device: str, n: int) -> tuple[float, bool]:
        """(seconds of the scheme's collectives per step at n ranks, whether any extrapolated)."""
        layout = self.layouts.get(layout_family(scheme), self.layout)
        return comm_time(self.fits, scheme, layout, backend, device, n)

    def step_at(self, scheme: str, backend: str, device: str, n: int, b: float, cal: dict, share: float):
        """The model's step (step_model.Step) of `scheme` at n ranks and per-device batch b from
        calibration `cal` (its share replaced by `share`), and whether the collectives extrapolated."""
        comm, extrapolated = self.comm(scheme, backend, device, n)
        parts = {"data_s": cal["data_s"], "transfers_s": cal["transfers_s"]}
        made = step(self.t1(b), share, cal["fixed_s"], comm, cal["overlap"], **parts)
        return made, extrapolated

    def forecast(self, scheme: str, backend: str, device: str, n: int, global_batch: int) -> dict:
        """Throughput, speedup and memory per device of `scheme` over n ranks at `global_batch`,
        with how it was reached."""
        if scheme not in MESSAGES:
            raise LookupError(f"{scheme} is not forecast (the model forecasts {', '.join(MESSAGES)})")
        b = global_batch / n
        source, fallback = scheme, modes.scheme_name(*modes.REFERENCE)
        if not any(k[:2] == (scheme, backend) for k in self.calibrated):
            source = fallback  # a scheme none of whose settings ran: DDP's share and overlap
        mine = [k for k in self.calibrated if k[:2] == (source, backend)]
        if not mine:
            kinds = label(fallback) if scheme == fallback else f"{label(scheme)} or {label(fallback)}"
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
        made, comm_extrapolated = self.step_at(scheme, backend, device, n, b, cal, share)
        step_s = made.total_s
        if not step_s > 0:  # a host share under 1 carried far: the measurements it rests on disagree
            raise LookupError(
                f"the model's step at n={n} is {step_s * 1e3:.2f} ms (host share {share:.2f}, fixed cost "
                f"{cal['fixed_s'] * 1e3:.2f} ms from {cal['settings']} setting(s)): its measurements disagree "
                "beyond what it can forecast from"
            )
        outside_b = not (self.batches[0] <= b <= self.batches[-1])
        basis = [
            f"{len(self.single)} single-device batch(es)",
            f"{cal['settings']} {label(source)} setting(s) at n={n if how_n is None else how_n}",
        ]
        if source != scheme:
            basis.append(f"no {scheme} setting ran: {label(fallback)}'s host share and overlap")
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
            "predicted_samples_per_s": global_batch / step_s,
            "predicted_memory_mb": self.memory.at(b, n, scheme) + self.outside,
            "predicted_speedup": (self.t1(global_batch) + self.data_s) / step_s,
            "how": "extrapolated" if extrapolated else "interpolated",
            "basis": "; ".join(basis),
            "distance": distance,
        }


def state_of(single: pd.DataFrame) -> dict[str, float]:
    """The single-device settings' model state parts, medians (MemoryLine's `state`)."""
    columns = [f"{part}_mb" for part in modes.STATE]
    if single.empty or not set(columns) <= set(single):
        return {}
    return {c.removesuffix("_mb"): float(single[c].median()) for c in columns}


def layout_family(scheme: str) -> str:
    return modes.of_scheme(scheme)[0].layout


def label(scheme: str) -> str:
    """'DDP', 'FSDP full': a scheme as the report names it."""
    facts, made = modes.of_scheme(scheme)
    return modes.display(facts.name, made.shard)


def interval(predicted: float, sigma: float, distance: float) -> tuple[float, float]:
    """The 95 % interval around a forecast: log-normal, sigma widened by the extrapolation's distance."""
    spread = Z95 * sigma * (1 + distance)
    return predicted * math.exp(-spread), predicted * math.exp(spread)
