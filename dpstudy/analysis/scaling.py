"""Why not n x: the step model's breakdown (dpstudy.analysis.step_model) of every finished
multi-device cell, against the ideal of its single-device baseline's step split n ways.

Per cell on n devices at global batch B (per-device b = B / n), in seconds per step, from its steady
epochs (medians over epochs >= 2; dpstudy.analysis.step_inputs) and its forecast group's calibration
(dpstudy.analysis.calibration.Calibration over every setting of the group, the cell's own among them):

  step_s       measured: the epoch's wall / its steps
  ideal_s      the baseline's step (the same settings on one device, dpstudy.analysis.baseline) / n
  the model    t1_s + sharing_s + fixed_s + exposed_s + data_s + transfers_s = predicted_s, where
               exposed_s, data_s and transfers_s are the cell's own, measured (its trace or its probe,
               step_inputs.EXPOSED_FROM: exposed_source), and t1_s, sharing_s, fixed_s the calibration's
  residual_s   step_s - predicted_s: what the model does not explain, never spread over its parts
  traced_exposed_s  the exposed communication by the cell's trace, beside the one the model read

The losses against the ideal add up to step_s - ideal_s exactly: per-device compute (t1(b) - t1(B) / n:
a step at 1/n of the batch costs more than 1/n of the step, by the fixed costs every rank pays), the
host's share, the strategy's fixed cost, the exposed collectives, the extra waiting for data (data_s -
the baseline's / n), DP's transfers, and the residual. comm_s is what the collectives cost alone by
their comm_fit lines, overlap = 1 - exposed_s / comm_s (below 0: slower beside compute than alone).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dpstudy.analysis import stats
from dpstudy.analysis.baseline import Baselines, baseline_key
from dpstudy.analysis.calibration import Calibration, calibration_inputs, group_of
from dpstudy.analysis.keys import FORECAST_GROUP, SETTING_KEYS
from dpstudy.analysis.step_inputs import cell_parts, setting_parts
from dpstudy.study import modes

LOSSES = {
    "loss_compute_s": "per-device compute (a step at 1/n of the batch costs more than 1/n: costs every rank pays)",
    "loss_sharing_s": "ranks sharing a host, slowing each other's steps",
    "loss_fixed_s": "what the strategy adds to every step (DDP's hooks and copies, FSDP's unshard and reshard)",
    "loss_exposed_s": "collectives (all-reduce, all-gather, reduce-scatter) the step did not hide",
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
    "traced_exposed_s",
    "measured_speedup",
    "predicted_speedup",
    *LOSSES,
    "base_sd_s",
    "largest",
)


def calibrations(
    settings: pd.DataFrame, cells: pd.DataFrame, epochs: pd.DataFrame, fits: pd.DataFrame, parts: pd.DataFrame
) -> dict:
    """Per forecast group (its values as baseline.baseline_key makes them, missing ones None): its
    Calibration over every one of its settings, DP and HSDP included."""
    single, multi = calibration_inputs(settings, cells, None, epochs, modes.multi_device_schemes(), parts)
    out = {}
    for key, own in multi.groupby(list(FORECAST_GROUP), dropna=False, sort=True):
        singles = group_of(single, key)
        if not singles.empty:
            out[baseline_key(key)] = Calibration(singles, own, fits)
    return out


def breakdown(cell: pd.Series, own: pd.Series, base: pd.Series, model: Calibration | None) -> dict:
    """One cell's row (see the module's docstring): `own` and `base` its and its baseline's parts."""
    n, scheme = int(cell["devices"]), modes.scheme_name(cell["mode"], cell.get("shard"))
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
    dp = modes.TABLE[cell["mode"]].transfers
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
        "loss_exposed_s": parts["exposed_s"],
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
        "traced_exposed_s": own["traced_exposed_s"],
        "measured_speedup": cell["speedup"],
        "predicted_speedup": base["step_s"] / predicted,
        **losses,
        "largest": LOSSES[max(known, key=known.get)] if known else None,
    }


@dataclass(frozen=True)
class Inputs:
    """What both tables read, made once (`inputs`): the cells' parts (step_inputs.cell_parts), each
    forecast group's Calibration (`calibrations`) and the timed single-device cells' Baselines."""

    parts: pd.DataFrame
    models: dict
    baselines: Baselines


def inputs(cells: pd.DataFrame, epochs: pd.DataFrame, settings: pd.DataFrame, fits: pd.DataFrame | None) -> Inputs:
    parts = cell_parts(cells, epochs)
    timed = cells[cells["cell"].isin(parts.index[parts["step_s"].notna()])]
    fits = fits if fits is not None else pd.DataFrame(columns=["collective", "backend", "device", "world_size"])
    return Inputs(parts, calibrations(settings, cells, epochs, fits, parts), Baselines(timed))


def cell_rows(cells: pd.DataFrame, made: Inputs) -> pd.DataFrame:
    """One row per finished multi-device cell that has a finished baseline (see the docstring)."""
    parts = made.parts
    ok = cells[cells["status"] == "ok"]
    multi = ok[(ok["devices"] > 1) & ok["cell"].isin(parts.index[parts["step_s"].notna()])]
    rows = []
    for _, cell in multi.iterrows():
        base = made.baselines.of(cell)
        if base.empty:
            continue
        base_parts = parts.loc[base["cell"], ["step_s", "data_step_s"]].median()
        found = made.models.get(baseline_key(cell[k] for k in FORECAST_GROUP))
        row = breakdown(cell, parts.loc[cell["cell"]], base_parts, found)
        row["base_sd_s"] = base["cell"].map(parts["step_s"]).std(ddof=1)  # NaN for one baseline run
        rows.append(row)
    return pd.DataFrame(rows, columns=list(COLUMNS))


def model(
    cells: pd.DataFrame, epochs: pd.DataFrame, settings: pd.DataFrame, fits: pd.DataFrame | None = None
) -> pd.DataFrame:
    """The `scaling` table: cell_rows."""
    return cell_rows(cells, inputs(cells, epochs, settings, fits))


def setting_rows(settings: pd.DataFrame, made: Inputs) -> pd.DataFrame:
    """The breakdown of every multi-device setting from the numbers its calibration read: its step as
    its quoted throughput gives it (the global batch / the geometric mean of its repeats'), the
    medians of its repeats' exposed communication, data wait and transfers; the baseline's step
    from the speedup's baseline throughput. Medians of the repeats' own rows would not add up: a
    median of differences is not the difference of medians. `cell` holds the setting's number."""
    parts = made.parts
    own = setting_parts(settings, parts)
    own["step_s"] = own["global_batch"] / own["samples_per_s"]
    multi = own[(own["devices"] > 1) & own["speedup"].notna() & own["step_s"].notna()]
    rows = []
    for _, setting in multi.iterrows():
        base_cells = made.baselines.of(setting)["cell"]
        base = pd.Series(
            {
                "step_s": setting["global_batch"] * setting["speedup"] / setting["samples_per_s"],
                "data_step_s": parts.loc[base_cells, "data_step_s"].median() if len(base_cells) else math.nan,
            }
        )
        found = made.models.get(baseline_key(setting[k] for k in FORECAST_GROUP))
        row = breakdown(setting.rename({"setting": "cell"}), setting, base, found)
        row["base_sd_s"] = parts.loc[base_cells, "step_s"].std(ddof=1) if len(base_cells) else math.nan
        rows.append(row)
    return pd.DataFrame(rows, columns=list(COLUMNS))


def with_noise(out: pd.DataFrame, table: pd.DataFrame, settings: pd.DataFrame) -> pd.DataFrame:
    """`out` (setting_rows) with the measured speedup's interval from the settings table
    (dpstudy.analysis.stats) and `noise_s`: how much the measured step varies between repeats
    (standard deviation over `table`'s cells, the baseline's share added in quadrature): a loss
    smaller than that, negative ones included, is measurement noise."""
    # keyed as baseline.baseline_key makes them: a missing value matches a missing one, 64 matches 64.0
    spread: dict[tuple, list[float]] = {}
    for row in table.to_dict("records"):
        spread.setdefault(baseline_key(row[k] for k in SETTING_KEYS), []).append(row["step_s"])
    steps = [spread.get(baseline_key(row[k] for k in SETTING_KEYS), []) for row in out.to_dict("records")]
    cell_sd = pd.Series([np.std(s, ddof=1) if len(s) > 1 else math.nan for s in steps], index=out.index)
    base_share = out["base_sd_s"] / out["n"]
    out["noise_s"] = np.sqrt(cell_sd.fillna(0) ** 2 + base_share.fillna(0) ** 2).where(
        cell_sd.notna() | base_share.notna()
    )
    # THE speedup of the setting, by its number (`cell` in setting_rows), as stats quotes it
    quoted = stats.speedups(settings).set_axis(settings["setting"].to_numpy())
    return out.drop(columns=["measured_speedup"]).join(quoted.rename(columns=lambda c: "measured_" + c), on="cell")


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


def tables(
    cells: pd.DataFrame, epochs: pd.DataFrame, settings: pd.DataFrame, fits: pd.DataFrame | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the `scaling` table, the `scaling_settings` table) from one set of Inputs. scaling_settings:
    setting_rows with the setting's number (`setting`), the measured speedup's interval and the
    noise (with_noise), `largest` the largest of its losses and `largest_s` its seconds (NaN when
    none was measured), in fixed columns."""
    made = inputs(cells, epochs, settings, fits)
    table = cell_rows(cells, made)
    out = setting_rows(settings, made) if not settings.empty else pd.DataFrame(columns=list(COLUMNS))
    if out.empty:
        return table, pd.DataFrame(columns=list(SETTING_MODEL_COLUMNS))
    out = with_noise(out, table, settings)
    out["setting"] = out["cell"].astype(int)
    out["largest"] = out[list(LOSSES)].fillna(-math.inf).idxmax(axis=1).map(LOSSES)
    out["largest_s"] = out[list(LOSSES)].max(axis=1, skipna=True)
    return table, out[list(SETTING_MODEL_COLUMNS)]


def settings_model(
    cells: pd.DataFrame, epochs: pd.DataFrame, settings: pd.DataFrame, fits: pd.DataFrame | None = None
) -> pd.DataFrame:
    """The `scaling_settings` table (`tables`)."""
    return tables(cells, epochs, settings, fits)[1]
