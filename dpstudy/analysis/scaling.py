"""Why not N x: a model of a multi-device cell's epoch, built from parts measured elsewhere.

For a finished multi-device cell on n devices and its single-device baseline b (the same
settings at the same global batch), per steady epoch (medians over epochs >= 2, then over repeats):

  ideal        T_b / n                  n devices splitting b's epoch perfectly
  compute      compute_b / n            b's compute time, split n ways
  data wait    wait                     the cell's own waiting for data
  all-reduce   steps x t_ar x (1 - overlap)
               t_ar: the gradients' bytes x 2(n-1)/n over the bus bandwidth comm_bench measured
               for the same backend, device and world size (else the probe's all-reduce alone);
               overlap: 1 - (step with the all-reduce - step under no_sync) / t_ar (the probe)
  DP           steps x (scatter + replicate + gather)         (the probe of a dp cell)
  predicted    compute + data wait + all-reduce + DP;  predicted speedup = T_b / predicted

The losses against ideal name what keeps a cell from n x, measured where the probe can: extra data
wait (wait - wait_b / n), the all-reduce the backward did not hide (steps x (step with it - step
under no_sync); this is also where DDP's bucketing beyond the bare all-reduce shows), DP's
transfers, per-device compute (steps x the step under no_sync - compute_b / n: steps that do not
shrink n-fold, ranks sharing cores or memory bandwidth), and the rest (optimizer steps, the
loop's own overhead): T - ideal - the four.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dpstudy.analysis import stats
from dpstudy.analysis.baseline import Baselines
from dpstudy.analysis.keys import SETTING_KEYS

LOSSES = {
    "loss_data_s": "waiting for data",
    "loss_sync_s": "gradient all-reduce the backward did not hide",
    "loss_dp_s": "DP scatter/replicate/gather",
    "loss_compute_s": "per-device compute (it does not shrink n-fold: smaller steps, shared cores)",
    "loss_other_s": "everything else (optimizer steps, synchronisation, start of each step)",
}
COLUMNS = (
    "cell",
    *SETTING_KEYS,
    "n",
    "steps",
    "measured_s",
    "ideal_s",
    "compute_s",
    "data_wait_s",
    "allreduce_s",
    "allreduce_source",
    "overlap",
    "dp_s",
    "predicted_s",
    "measured_speedup",
    "predicted_speedup",
    *LOSSES,
    "base_sd_s",
    "largest",
)


def epoch_medians(epochs: pd.DataFrame) -> pd.DataFrame:
    """Per cell: median wall, compute, data wait and samples over its steady epochs."""
    steady = epochs[~epochs["warmup"].astype(bool)]
    return steady.groupby("cell")[["wall_s", "compute_s", "data_wait_s", "samples"]].median()


def bus_bandwidth(
    comm: pd.DataFrame | None, backend: str, device: str, world: int, nbytes: float, collective: str = "all_reduce"
) -> float | None:
    """comm_bench's bus bandwidth (GB/s) of `collective` at `nbytes` (the total size S, as
    dpstudy.microbench.comm defines it), interpolated in log size; None without a row. Rows without a
    `collective` (a comm.csv from before the column) are all_reduce."""
    if comm is None or comm.empty:
        return None
    kind = comm["collective"].fillna("all_reduce") if "collective" in comm else "all_reduce"
    rows = comm[
        (kind == collective)
        & (comm["backend"] == backend)
        & (comm["device"] == device)
        & (comm["world_size"] == world)
        & comm["reason"].isna()
        & comm["busbw_gbps"].notna()
    ].sort_values("bytes")
    if rows.empty:
        return None
    return float(np.interp(math.log(nbytes), np.log(rows["bytes"].astype(float)), rows["busbw_gbps"]))


def allreduce_time(cell: pd.Series, comm: pd.DataFrame | None) -> tuple[float, str]:
    """(seconds per all-reduce of the gradients, where the number comes from)."""
    n, nbytes = int(cell["devices"]), cell["grad_bytes"]
    if pd.isna(nbytes):
        return (math.nan, "none")
    busbw = bus_bandwidth(comm, cell["backend"], cell["env_device"], n, float(nbytes))
    if busbw:
        return (float(nbytes) * 2 * (n - 1) / n / (busbw * 1e9), "comm_bench")
    if pd.notna(cell["allreduce_s"]):
        return (float(cell["allreduce_s"]), "probe")
    return (math.nan, "none")


def model_cell(cell: pd.Series, part: pd.Series, base: pd.Series, comm: pd.DataFrame | None) -> dict:
    """The model of one cell; a part that was not measured is NaN and counts as 0 in the sums."""
    n = int(cell["devices"])
    steps = math.ceil(part["samples"] / n / (cell["global_batch"] / n))
    exposed = cell["sync_step_s"] - cell["nosync_step_s"]
    overlap = float(np.clip(1 - exposed / cell["allreduce_s"], 0, 1)) if cell["allreduce_s"] > 0 else math.nan
    allreduce = dp = math.nan
    source = "none"
    if cell["mode"] == "ddp":
        t_ar, source = allreduce_time(cell, comm)
        allreduce = steps * t_ar * (1 - (0.0 if math.isnan(overlap) else overlap))
    transfers = [cell[k] for k in ("scatter_s", "replicate_s", "gather_s")]
    if cell["mode"] == "dp" and not any(pd.isna(t) for t in transfers):
        dp = steps * sum(transfers)
    compute, wait = base["compute_s"] / n, part["data_wait_s"]
    predicted = compute + wait + np.nansum([allreduce, dp])
    if cell["mode"] == "fsdp":  # its all-gathers and reduce-scatters have no term yet: no prediction
        predicted = math.nan
    ideal, measured = base["wall_s"] / n, part["wall_s"]
    # Measured by the probe: the all-reduce time the backward left exposed, and the forward and
    # backward without it against b's compute split n ways. Without a probe, the model's term.
    sync = steps * exposed if pd.notna(exposed) else allreduce
    per_device = steps * cell["nosync_step_s"] - compute if pd.notna(cell["nosync_step_s"]) else math.nan
    losses = {
        "loss_data_s": wait - base["data_wait_s"] / n,
        "loss_sync_s": sync,
        "loss_dp_s": dp,
        "loss_compute_s": per_device,
    }
    losses["loss_other_s"] = measured - ideal - np.nansum(list(losses.values()))
    known = {k: v for k, v in losses.items() if pd.notna(v)}
    return {
        "cell": cell["cell"],
        **{k: cell[k] for k in SETTING_KEYS},
        "n": n,
        "steps": steps,
        "measured_s": measured,
        "ideal_s": ideal,
        "compute_s": compute,
        "data_wait_s": wait,
        "allreduce_s": allreduce,
        "allreduce_source": source,
        "overlap": overlap,
        "dp_s": dp,
        "predicted_s": predicted,
        "measured_speedup": cell["speedup"],
        "predicted_speedup": base["wall_s"] / predicted * part["samples"] / base["samples"],
        **losses,
        "largest": LOSSES[max(known, key=known.get)],
    }


def model(cells: pd.DataFrame, epochs: pd.DataFrame, comm: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per finished multi-device cell that has a finished baseline (see the docstring)."""
    parts = epoch_medians(epochs)
    ok = cells[cells["status"] == "ok"]
    multi = ok[(ok["devices"] > 1) & ok["cell"].isin(parts.index)]
    # the baseline repeats whose epochs give the compute and data-wait parts
    baselines = Baselines(cells[cells["cell"].isin(parts.index)].join(parts, on="cell"))
    rows = []
    for _, cell in multi.iterrows():
        base = baselines.of(cell)
        if not base.empty:
            parts_of_base = base[["wall_s", "compute_s", "data_wait_s", "samples"]].median()
            row = model_cell(cell, parts.loc[cell["cell"]], parts_of_base, comm)
            row["base_sd_s"] = base["wall_s"].std(ddof=1)  # NaN for one baseline run
            rows.append(row)
    return pd.DataFrame(rows, columns=list(COLUMNS))


def by_setting(table: pd.DataFrame, settings: pd.DataFrame) -> pd.DataFrame:
    """Repeats of a setting folded into medians, `largest` recomputed from the median losses.

    The measured speedup is THE setting's speedup with its interval, from the settings table
    (dpstudy.analysis.stats), not a median of the repeats' ratios. `noise_s` is how much the measured epoch
    varies between repeats (standard deviation, the baseline's share added in quadrature): a loss
    smaller than that, negative ones included, is measurement noise."""
    if table.empty:
        return table.assign(measured_speedup_low=[], measured_speedup_high=[], noise_s=[])
    numeric = [c for c in COLUMNS if c not in ("cell", "allreduce_source", "largest", *SETTING_KEYS)]
    grouped = table.groupby(SETTING_KEYS, dropna=False, sort=True)
    out = grouped[numeric].median().join(grouped["allreduce_source"].first())
    spread = grouped["measured_s"].std(ddof=1).rename("cell_sd")
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
