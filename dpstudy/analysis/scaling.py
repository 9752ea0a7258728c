"""Why not n x: the step model's breakdown (dpstudy.analysis.step_model) of every finished
multi-device cell, against the ideal of its single-device baseline's step split n ways.

Per cell on n devices at global batch B (per-device b = B / n), in seconds per step, from its steady
epochs (medians over epochs >= 2; dpstudy.analysis.step_inputs) and its forecast group's calibration
(dpstudy.analysis.forecast.Calibration over every setting of the group, the cell's own among them):

  step_s       measured: the epoch's wall / its steps
  ideal_s      the baseline's step (the same settings on one device, dpstudy.analysis.baseline) / n
  the model    t1_s + sharing_s + fixed_s + exposed_s + data_s + transfers_s = predicted_s, where
               exposed_s, data_s and transfers_s are the cell's own, measured (its trace or its probe,
               step_inputs.EXPOSED_FROM: exposed_source), and t1_s, sharing_s, fixed_s the calibration's
  residual_s   step_s - predicted_s: what the model does not explain, never spread over its parts

The losses against the ideal add up to step_s - ideal_s exactly: per-device compute (t1(b) - t1(B) / n:
a step at 1/n of the batch costs more than 1/n of the step, by the fixed costs every rank pays), the
host's share, the strategy's fixed cost, the exposed collectives, the extra waiting for data (data_s -
the baseline's / n), DP's transfers, and the residual. comm_s is what the collectives cost alone by
their comm_fit lines, overlap = 1 - exposed_s / comm_s (below 0: slower beside compute than alone).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dpstudy.analysis import stats
from dpstudy.analysis.baseline import Baselines, baseline_key
from dpstudy.analysis.forecast import FORECAST_GROUP, Calibration
from dpstudy.analysis.forecast_table import calibration_inputs, group_of
from dpstudy.analysis.keys import SETTING_KEYS
from dpstudy.analysis.step_inputs import cell_parts
from dpstudy.analysis.step_model import MESSAGES, scheme_of

SCHEMES = (*MESSAGES, "fsdp hybrid", "dp")
LOSSES = {
    "loss_compute_s": "per-device compute (a step at 1/n of the batch costs more than 1/n: costs every rank pays)",
    "loss_sharing_s": "ranks sharing a host, slowing each other's steps",
    "loss_fixed_s": "what the strategy adds to every step (DDP's hooks and copies, FSDP's unshard and reshard)",
    "loss_sync_s": "collectives (all-reduce, all-gather, reduce-scatter) the step did not hide",
    "loss_data_s": "waiting for data",
    "loss_dp_s": "DP scatter/replicate/gather",
    "residual_s": "the rest, which the model does not explain",
}
PARTS = ("t1_s", "sharing_s", "fixed_s", "exposed_s", "data_s", "transfers_s")
COLUMNS = (
    "cell",
    *SETTING_KEYS,
    "n",
    "scheme",
    "step_s",
    "ideal_s",
    *PARTS,
    "predicted_s",
    "comm_s",
    "overlap",
    "exposed_source",
    "measured_speedup",
    "predicted_speedup",
    *LOSSES,
    "base_sd_s",
    "largest",
)


def calibrations(settings: pd.DataFrame, cells: pd.DataFrame, epochs: pd.DataFrame, fits: pd.DataFrame) -> dict:
    """Per forecast group (its values as baseline.baseline_key makes them, missing ones None): its
    Calibration over every one of its settings, DP and HSDP included."""
    single, multi = calibration_inputs(settings, cells, None, epochs, SCHEMES)
    out = {}
    for key, own in multi.groupby(list(FORECAST_GROUP), dropna=False, sort=True):
        singles = group_of(single, key)
        if not singles.empty:
            out[baseline_key(key)] = Calibration(singles, own, fits)
    return out


def breakdown(cell: pd.Series, own: pd.Series, base: pd.Series, model: Calibration | None) -> dict:
    """One cell's row (see the module's docstring): `own` and `base` its and its baseline's parts."""
    n, scheme = int(cell["devices"]), scheme_of(cell["mode"], cell.get("shard"))
    b = cell["global_batch"] / n
    cal = model.calibrated.get((scheme, cell["backend"], n)) if model else None
    parts = dict.fromkeys(("t1_s", "sharing_s", "fixed_s"), math.nan)
    comm = math.nan
    if cal is not None:
        parts = {"t1_s": model.t1(b), "sharing_s": (cal["share"] - 1) * model.t1(b), "fixed_s": cal["fixed_s"]}
        try:
            comm = model.comm(scheme, cell["backend"], cell["env_device"], n)[0]
        except LookupError:  # no fit, or DP and HSDP, whose collectives the model does not price
            pass
    dp = cell["mode"] == "dp"
    parts["exposed_s"] = 0.0 if dp else own["exposed_step_s"]
    parts["data_s"] = own["data_step_s"]
    parts["transfers_s"] = own["transfers_s"] if dp else 0.0
    predicted = sum(parts.values())  # NaN when any part is unknown
    base_t1 = base["step_s"] - base["data_step_s"]
    ideal = base["step_s"] / n
    losses = {
        "loss_compute_s": parts["t1_s"] - base_t1 / n,
        "loss_sharing_s": parts["sharing_s"],
        "loss_fixed_s": parts["fixed_s"],
        "loss_sync_s": parts["exposed_s"],
        "loss_data_s": parts["data_s"] - base["data_step_s"] / n,
        "loss_dp_s": parts["transfers_s"] if dp else math.nan,
        "residual_s": own["step_s"] - predicted,
    }
    known = {k: v for k, v in losses.items() if pd.notna(v)}
    return {
        "cell": cell["cell"],
        **{k: cell[k] for k in SETTING_KEYS},
        "n": n,
        "scheme": scheme,
        "step_s": own["step_s"],
        "ideal_s": ideal,
        **parts,
        "predicted_s": predicted,
        "comm_s": comm,
        "overlap": 1 - parts["exposed_s"] / comm if comm > 0 else math.nan,
        "exposed_source": "none" if dp else own["exposed_source"],
        "measured_speedup": cell["speedup"],
        "predicted_speedup": base["step_s"] / predicted,
        **losses,
        "largest": LOSSES[max(known, key=known.get)] if known else None,
    }


def model(
    cells: pd.DataFrame, epochs: pd.DataFrame, settings: pd.DataFrame, fits: pd.DataFrame | None = None
) -> pd.DataFrame:
    """One row per finished multi-device cell that has a finished baseline (see the docstring)."""
    fits = fits if fits is not None else pd.DataFrame(columns=["collective", "backend", "device", "world_size"])
    parts = cell_parts(cells, epochs)
    ok = cells[cells["status"] == "ok"]
    timed = parts.index[parts["step_s"].notna()]
    multi = ok[(ok["devices"] > 1) & ok["cell"].isin(timed)]
    if multi.empty:
        return pd.DataFrame(columns=list(COLUMNS))
    models = calibrations(settings, cells, epochs, fits)
    baselines = Baselines(cells[cells["cell"].isin(timed)])
    rows = []
    for _, cell in multi.iterrows():
        base = baselines.of(cell)
        if base.empty:
            continue
        base_parts = parts.loc[base["cell"], ["step_s", "data_step_s"]].median()
        found = models.get(baseline_key(cell[k] for k in FORECAST_GROUP))
        row = breakdown(cell, parts.loc[cell["cell"]], base_parts, found)
        row["base_sd_s"] = base["cell"].map(parts["step_s"]).std(ddof=1)  # NaN for one baseline run
        rows.append(row)
    return pd.DataFrame(rows, columns=list(COLUMNS))


def by_setting(table: pd.DataFrame, settings: pd.DataFrame) -> pd.DataFrame:
    """Repeats of a setting folded into medians, `largest` recomputed from the median losses.

    The measured speedup is THE setting's speedup with its interval, from the settings table
    (dpstudy.analysis.stats), not a median of the repeats' ratios. `noise_s` is how much the measured step
    varies between repeats (standard deviation, the baseline's share added in quadrature): a loss
    smaller than that, negative ones included, is measurement noise."""
    if table.empty:
        return table.assign(measured_speedup_low=[], measured_speedup_high=[], noise_s=[])
    text = ("cell", "scheme", "exposed_source", "largest", *SETTING_KEYS)
    numeric = [c for c in COLUMNS if c not in text]
    grouped = table.groupby(SETTING_KEYS, dropna=False, sort=True)
    out = grouped[numeric].median().join(grouped[["scheme", "exposed_source"]].first())
    spread = grouped["step_s"].std(ddof=1).rename("cell_sd")
    out = out.join(spread).reset_index()
    base_share = out["base_sd_s"] / out["n"]
    out["noise_s"] = np.sqrt(out["cell_sd"].fillna(0) ** 2 + base_share.fillna(0) ** 2).where(
        out["cell_sd"].notna() | base_share.notna()
    )
    quoted = stats.speedups(settings).rename(columns=lambda c: "measured_" + c)
    out = out.drop(columns=["measured_speedup", "cell_sd"]).join(quoted, on=SETTING_KEYS)
    out["largest"] = out[list(LOSSES)].fillna(-math.inf).idxmax(axis=1).map(LOSSES)
    return out


# The model per setting: a setting's number instead of a cell id, the measured speedup's interval
# from the settings table, the noise between repeats and the largest loss's seconds.
SETTING_MODEL_COLUMNS = (
    "setting",
    *(
        c
        for c in COLUMNS
        if c not in ("cell", "measured_speedup", "predicted_speedup", *LOSSES, "base_sd_s", "largest")
    ),
    "measured_speedup",
    "measured_speedup_low",
    "measured_speedup_high",
    "predicted_speedup",
    *LOSSES,
    "base_sd_s",
    "noise_s",
    "largest",
    "largest_s",
)


def settings_model(table: pd.DataFrame, settings: pd.DataFrame) -> pd.DataFrame:
    """The `scaling_settings` table: `by_setting`, with the setting's number in the settings table
    (`setting`) and the seconds of its largest loss (`largest_s`: the largest of the losses
    measured, NaN when none was), in fixed columns."""
    out = by_setting(table, settings)
    if out.empty:
        return pd.DataFrame(columns=list(SETTING_MODEL_COLUMNS))
    out = out.join(settings.set_index(SETTING_KEYS)["setting"], on=SETTING_KEYS)
    out["largest_s"] = out[list(LOSSES)].max(axis=1, skipna=True)
    return out[list(SETTING_MODEL_COLUMNS)]
