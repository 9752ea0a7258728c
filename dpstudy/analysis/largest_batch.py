"""Each strategy at the largest per-device batch that fits (issue 50): the `largest_batch` table.

A workload up to its global batch (GROUP_KEYS: dataset, model, precision, ..., the device kind; its
number is `group`) is trained by strategies (strategies.STRATEGY_KEYS), each at one or more batches.
One row per group and strategy the cells name, run or not:

  memory       peak(b) = fixed_mb + per_sample_mb b: the fullest device's step peak against the
               per-device batch b, the allocator's on CUDA (what a capacity holds). Where the
               strategy has two or more per-device batches, the line through them (linefit.line_fit):
               each its finished settings' median (memory_forecast.held_memory) or, at a batch none
               of its cells finished (skipped by the budget, out of memory), the memory plan's
               prediction for the fullest device (memory_split's predicted_allocated_mb, else
               predicted_peak_mb). Else the forecast group's memory model as calibration.py forecasts
               it (memory_forecast.MemoryLine over calibration.calibration_inputs: the one-device
               line, the state over n under FSDP, the scheme's own extra, plus what a CUDA allocator
               held beyond the tracker). DP and HSDP have no such model. `memory_basis` says which.
  capacity     memory_budget_gib where the study sets one, else on CUDA the smallest device the cells
               recorded (capacity.measured); a CPU study without a budget has none, and no b*.
  b*           `largest_batch`: the largest integer b with need(peak(b)) <= capacity, need the budget's
               (budget.need_of: + 10 %, on CUDA the measured context, else 1 GiB), so
               b* = floor(((capacity - context) / 1.1 - fixed) / per_sample), kept below the smallest
               per-device batch of the strategy that ran out of memory; `how` interpolated within the
               per-device batches the line rests on, else extrapolated; `need_mb` at b*.
  throughput   `source` measured where a finished setting of the strategy ran at b* (`setting`: the
               settings table's samples/s, tokens/s and MFU with their 95 % intervals); else forecast:
               DDP and FSDP full or grad_op on one node by calibration.Calibration at b* x devices, one
               device by its step-time line (Calibration.t1), each with calibration.interval around it
               (sigma as forecast_table.forecasts makes it), `basis` what it rests on; else none, with
               the `reason`. A forecast's tokens/s and MFU are its samples/s x the strategy's own
               constants (tokens_per_s / samples_per_s of its settings, utilisation's).
  rank         per group by samples/s at b*; `fastest` the first, and on it `lead_claim`: +1 when its
               interval clears the next's (stats.compare), else 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dpstudy.analysis import memory_forecast, stats
from dpstudy.analysis.calibration import Calibration, calibration_inputs, group_of, interval, state_of
from dpstudy.analysis.capacity import measured
from dpstudy.analysis.forecast_table import held_out_rows, model_sigma, sigmas
from dpstudy.analysis.keys import FORECAST_GROUP, GROUP_KEYS, STRATEGY_KEYS
from dpstudy.analysis.linefit import line_fit
from dpstudy.analysis.memory_forecast import MemoryLine, held_memory
from dpstudy.analysis.strategies import with_device_kind
from dpstudy.study import modes
from dpstudy.study.budget import FRAGMENTATION, GIB, need_of

KEYS = (*GROUP_KEYS, *STRATEGY_KEYS)
METRICS = tuple(f"{m}{p}" for m in ("samples_per_s", "tokens_per_s", "mfu") for p in ("", "_low", "_high"))
COLUMNS = (
    *("group", *GROUP_KEYS, *STRATEGY_KEYS, "devices", "memory_basis", "fixed_mb", "per_sample_mb"),
    *("capacity_mb", "capacity_source", "largest_batch", "largest_global_batch", "need_mb", "how"),
    *("source", "reason", "setting", "basis", *METRICS, "rank", "fastest", "lead_claim"),
)
UNMODELLED = {  # schemes neither the memory model nor the throughput model has (the modes' table)
    name: f"the step model prices no {modes.display(*name.partition(' ')[::2])} ({modes.of_scheme(name)[1].unpriced})"
    for name in modes.schemes()
    if modes.of_scheme(name)[1].unpriced
}
ONE_DEVICE = modes.scheme_name(modes.BASELINE)


@dataclass(frozen=True)
class Line:
    """peak(b) = fixed + per_sample b in MB, resting on the per-device `batches`."""

    fixed: float
    per_sample: float
    batches: tuple[float, ...]
    basis: str

    def __call__(self, b: float) -> float:
        return self.fixed + self.per_sample * b


def normal(key: tuple) -> tuple:
    """A groupby key with every missing value as None: keys of two tables compare equal."""
    return tuple(None if pd.isna(v) else v for v in key)


def per_device(frame: pd.DataFrame) -> pd.Series:
    return frame["global_batch"].astype(float) / frame["devices"].astype(float)


def plan_peaks(split: pd.DataFrame | None) -> pd.Series:
    """Per cell: the memory plan's prediction for its fullest device, the allocator's peak where it
    predicted one (what the budget held it against), else the tracker's."""
    if split is None or split.empty or "predicted_peak_mb" not in split:
        return pd.Series(dtype=float)
    held = split["predicted_allocated_mb"].fillna(split["predicted_peak_mb"])
    return held.groupby(split["cell"]).max().dropna()


def own_line(cells: pd.DataFrame, own: pd.DataFrame, planned: pd.Series) -> Line | None:
    """The line through the strategy's own per-device batches; None with fewer than two."""
    done: dict[float, list[float]] = {}
    for b, mb in zip(per_device(own), own["held_mb"], strict=True):
        if pd.notna(mb):
            done.setdefault(b, []).append(mb)
    plan: dict[float, list[float]] = {}
    for cell, b in zip(cells["cell"], per_device(cells), strict=True):
        if b not in done and cell in planned.index:
            plan.setdefault(b, []).append(planned[cell])
    points = {b: float(np.median(v)) for b, v in {**plan, **done}.items()}
    if len(points) < 2:
        return None
    fixed, per_sample = line_fit(points.keys(), points.values())
    basis = f"its own line through {len(done)} measured and {len(plan)} planned per-device batch(es)"
    return Line(fixed, per_sample, tuple(sorted(points)), basis)


def model_line(single: pd.DataFrame, multi: pd.DataFrame, scheme: str, n: int) -> tuple[Line | None, str]:
    """The forecast group's memory model at n devices of `scheme`, as calibration.Calibration builds
    it (None and why where it has none)."""
    if scheme in UNMODELLED:
        return None, f"fewer than two per-device batches of its own, and {UNMODELLED[scheme]}"
    memory = MemoryLine(
        list(zip(single["global_batch"].astype(float), single["memory_mb"], strict=True)),
        [
            (s, b / k, k, mb)
            for s, b, k, mb in zip(multi["scheme"], multi["global_batch"], multi["devices"], multi["memory_mb"])
        ],
        state_of(single),
    )
    if not memory.known:
        return None, "fewer than two per-device batches of its own, and no memory measured in its forecast group"
    outside = pd.concat([frame["outside_mb"] for frame in (single, multi)]).dropna()
    fixed = memory.at(0.0, n, scheme) + (float(outside.median()) if len(outside) else 0.0)
    rests = single if single["memory_mb"].notna().any() else multi[~multi["scheme"].map(memory_forecast.sharded)]
    batches = tuple(sorted(set(per_device(rests[rests["memory_mb"].notna()]))))
    return Line(fixed, memory.per_sample, batches, f"the forecast group's memory model ({memory.basis})"), ""


def largest(line: Line, capacity: float, on_cuda: bool, context: float | None, oom: list[float]) -> dict:
    """b*, its need and how it was reached; or the reason there is none."""
    if line.per_sample <= 0:
        return {"reason": "its memory does not grow with the batch: no batch is the largest"}
    room = (capacity - need_of(0.0, on_cuda, context)) / (1 + FRAGMENTATION)  # the peak need_of lets through
    b = math.floor((room - line.fixed) / line.per_sample + 1e-9)
    below_oom = bool(oom) and b >= min(oom)
    b = int(math.ceil(min(oom))) - 1 if below_oom else b
    if b < 1:
        need = need_of(line(1), on_cuda, context)
        return {"reason": f"does not fit at per-device batch 1 (needs {need:.0f} MB of {capacity:.0f})"}
    how = "interpolated" if line.batches and line.batches[0] <= b <= line.batches[-1] else "extrapolated"
    basis = line.basis + (f"; below per-device batch {min(oom):g}, which ran out of memory" if below_oom else "")
    return {"largest_batch": b, "need_mb": need_of(line(b), on_cuda, context), "how": how, "memory_basis": basis}


class Forecaster:
    """calibration.py's model of each forecast group at a strategy's b*, and the forecasts' sigma
    (the leave-one-out error, made only when a forecast needs it)."""

    def __init__(self, single: pd.DataFrame, multi: pd.DataFrame, fits: pd.DataFrame, noise: pd.Series | None):
        self.single, self.multi, self.fits, self.noise = single, multi, fits, noise
        self._sigma: float | None = None

    def sigma(self) -> float:
        if self._sigma is None:
            held = held_out_rows(self.single, self.multi, self.fits)
            self._sigma = sigmas(held)[0] if not held.empty else model_sigma(pd.Series(dtype=float), self.noise)
        return self._sigma

    def at(self, strategy: dict, b: int) -> dict:
        """The forecast of `strategy` at per-device batch b, or source none and why."""
        scheme, n = modes.scheme_name(strategy["mode"], strategy["shard"]), int(strategy["devices"])
        key = tuple(strategy[k] for k in FORECAST_GROUP)
        singles = group_of(self.single, key)
        if singles.empty:
            return none("not forecast: no one-device setting of its forecast group finished")
        if scheme == ONE_DEVICE:
            model = Calibration(singles, self.multi.iloc[0:0], self.fits)
            low, high = model.batches[0], model.batches[-1]
            distance = 0.0 if low <= b <= high else min(abs(math.log2(b / low)), abs(math.log2(b / high)))
            basis = f"{len(model.single)} single-device batch(es): the step-time line"
            basis += f"; batch {b} outside the measured {low:g}-{high:g}" if distance else ""
            made = {"predicted_samples_per_s": b / model.t1(b), "distance": distance, "basis": basis}
        elif scheme in UNMODELLED:
            return none(f"not forecast: {UNMODELLED[scheme]}")
        elif strategy["nodes"] > 1:
            return none("not forecast: the step model prices ranks on one host")
        else:
            try:  # no setting of its kind over its backend, no collective's fit: the model says which
                model = Calibration(singles, group_of(self.multi, key), self.fits)
                made = model.forecast(scheme, strategy["backend"], strategy["env_device"], n, b * n)
            except LookupError as error:
                return none(f"not forecast: {error}")
        value = made["predicted_samples_per_s"]
        low, high = interval(value, self.sigma(), made["distance"])
        return {"source": "forecast", "basis": made["basis"], **dict(zip(METRICS[:3], (value, low, high)))}


def none(reason: str) -> dict:
    return {"source": "none", "reason": reason}


def measured_at(own: pd.DataFrame, b: int) -> dict | None:
    """The strategy's finished setting at per-device batch b, as a row's throughput."""
    rows = own[per_device(own) == b]
    if rows.empty:
        return None
    row = rows.iloc[0]
    return {"source": "measured", "setting": row["setting"], **{m: row.get(m, math.nan) for m in METRICS}}


def with_work(made: dict, own: pd.DataFrame, cells: pd.DataFrame) -> dict:
    """A forecast's tokens/s and MFU: its samples/s x the strategy's constants (a text workload's
    tokens per sample from any of its cells when none of its settings finished)."""
    for metric in ("tokens_per_s", "mfu"):
        ratios = (own[metric] / own["samples_per_s"]).dropna() if metric in own else ()
        factor = ratios.iloc[0] if len(ratios) else math.nan
        if metric == "tokens_per_s" and math.isnan(factor) and "tokens_per_sample" in cells:
            tokens = pd.to_numeric(cells["tokens_per_sample"], errors="coerce").dropna()
            factor = float(tokens.iloc[0]) if len(tokens) else math.nan
        for part in ("", "_low", "_high"):
            made[f"{metric}{part}"] = made[f"samples_per_s{part}"] * factor
    return made


def strategy_row(strategy: dict, cells: pd.DataFrame, own: pd.DataFrame, study: dict) -> dict:
    """One strategy's row (the module docstring)."""
    scheme, n = modes.scheme_name(strategy["mode"], strategy["shard"]), int(strategy["devices"])
    key = tuple(strategy[k] for k in FORECAST_GROUP)
    line, why = own_line(cells, own, study["planned"]), ""
    if line is None:
        line, why = model_line(group_of(study["single"], key), group_of(study["multi"], key), scheme, n)
    if line is None:
        return {**strategy, **none(f"no memory line: {why}")}
    row = {**strategy, "memory_basis": line.basis, "fixed_mb": line.fixed, "per_sample_mb": line.per_sample}
    on_cuda = strategy["env_device"] == "cuda"
    if study["budget_gib"]:
        row.update(capacity_mb=study["budget_gib"] * GIB, capacity_source="memory_budget_gib")
    elif on_cuda and not math.isnan(study["device_mb"]):
        row.update(capacity_mb=study["device_mb"], capacity_source="device memory")
    else:
        why = "no CUDA cell recorded its device's memory" if on_cuda else "a CPU study without memory_budget_gib"
        return {**row, **none(f"no capacity: {why}, so nothing bounds the batch")}
    context = None if math.isnan(study["context_mb"]) else study["context_mb"]
    oom = sorted(per_device(cells[cells["status"] == "oom"]))
    found = largest(line, row["capacity_mb"], on_cuda, context, oom)
    if "largest_batch" not in found:
        return {**row, **none(found["reason"])}
    row.update(found, largest_global_batch=found["largest_batch"] * n)
    made = measured_at(own, found["largest_batch"]) or study["forecaster"].at(strategy, found["largest_batch"])
    return {**row, **(with_work(made, own, cells) if made["source"] == "forecast" else made)}


def ranked(table: pd.DataFrame) -> pd.DataFrame:
    """rank, fastest and lead_claim per group (the module docstring)."""
    table["rank"] = table.groupby("group")["samples_per_s"].rank(ascending=False, method="first").astype("Int64")
    table["fastest"] = table["rank"].eq(1).fillna(False).astype(bool)
    table["lead_claim"] = pd.array([pd.NA] * len(table), dtype="Int64")
    for _, rows in table.dropna(subset=["samples_per_s"]).groupby("group"):
        order = rows.sort_values("rank")
        if len(order) >= 2:
            first, second = (stats.value(order.iloc[i], "samples_per_s") for i in (0, 1))
            table.loc[order.index[0], "lead_claim"] = stats.compare(first, second)
    return table


def largest_batch_table(
    cells: pd.DataFrame,
    settings: pd.DataFrame,
    split: pd.DataFrame | None,
    fits: pd.DataFrame,
    budget_gib: float | None = None,
) -> pd.DataFrame:
    """The `largest_batch` table (the module docstring) from the cells, settings (with utilisation),
    memory_split and comm_fit tables and the study's memory_budget_gib."""
    if cells.empty:
        return pd.DataFrame(columns=list(COLUMNS))
    cells = with_device_kind(cells)
    single, multi = calibration_inputs(settings, cells, split)
    held = settings.assign(held_mb=held_memory(settings, split))
    own_settings = {normal(k): g for k, g in held.groupby(list(KEYS), dropna=False)} if not held.empty else {}
    study = {
        "single": single,
        "multi": multi,
        "planned": plan_peaks(split),
        "budget_gib": budget_gib,
        "device_mb": measured(split, "total_mb", "min"),
        "context_mb": measured(split, "context_mb", "median"),
        "forecaster": Forecaster(single, multi, fits, settings.get("noise_cv")),
    }
    rows = []
    for key, mine in cells.groupby(list(KEYS), dropna=False, sort=True):
        strategy = {**dict(zip(KEYS, key, strict=True)), "devices": int(mine["devices"].iloc[0])}
        own = own_settings.get(normal(key), held.iloc[0:0])
        rows.append(strategy_row(strategy, mine, own, study))
    table = pd.DataFrame(rows).reindex(columns=list(COLUMNS))
    table["group"] = table.groupby(list(GROUP_KEYS), dropna=False, sort=True).ngroup()
    ints = ("largest_batch", "largest_global_batch", "setting")
    table = ranked(table.astype({**{c: "Int64" for c in ints}, **{c: float for c in METRICS}}))
    return table.sort_values(["group", "rank", "mode", "devices"], ignore_index=True, na_position="last")
