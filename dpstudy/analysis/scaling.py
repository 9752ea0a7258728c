"""Why not N x: a model of a multi-device cell's epoch, built from parts measured elsewhere.

For a finished multi-device cell on n devices and its single-device baseline b (the same
settings at the same global batch), per steady epoch (medians over epochs >= 2, then over repeats):

  ideal        T_b / n                  n devices splitting b's epoch perfectly
  compute      compute_b / n            b's compute time, split n ways
  data wait    wait                     the cell's own waiting for data
  sync         steps x t_sync x (1 - overlap), the collectives that keep the ranks in step:
               DDP: t_sync = the all-reduce of the gradients, their bytes x 2(n-1)/n over the bus
               bandwidth comm_bench measured for the same backend, device and world size (else
               the probe's all-reduce alone); overlap: 1 - (step with the all-reduce - step under
               no_sync) / the probe's all-reduce.
               FSDP: t_sync = the parameters' all-gather before forward (again before backward
               when shard is full) and the gradients' reduce-scatter, each its bytes x (n-1)/n
               over comm_bench's all-gather or reduce-scatter bus bandwidth at the mean unit's
               size (else the probe's collectives alone); overlap: 1 - (step as FSDP runs it -
               the same step on an unsharded replica) / the probe's collectives.
  DP           steps x (scatter + replicate + gather)         (the probe of a dp cell)
  predicted    compute + data wait + sync + DP;  predicted speedup = T_b / predicted

The losses against ideal name what keeps a cell from n x, measured where the probe can: extra data
wait (wait - wait_b / n), the collectives the step did not hide (steps x the trace's exposed
communication where the cell has a trace, dpstudy.engine.trace_figures; else steps x (the probe's
step with them - step without), where DDP's bucketing and FSDP's copies beyond the bare collectives
also show; `exposed_source` says which), DP's
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
from dpstudy.util.busfactors import bus_factor

LOSSES = {
    "loss_data_s": "waiting for data",
    "loss_sync_s": "collectives (all-reduce, all-gather, reduce-scatter) the step did not hide",
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
    "sync_s",
    "sync_source",
    "exposed_source",
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
    """Per cell: median wall, compute, data wait and samples over its steady epochs. The steps that
    compiled a graph (compile: true) are not training work: their seconds leave wall and compute,
    as they leave the throughput's steady window."""
    steady = epochs[~epochs["warmup"].astype(bool)]
    compiling = steady["compile_s"].fillna(0.0) if "compile_s" in steady else 0.0
    steady = steady.assign(wall_s=steady["wall_s"] - compiling, compute_s=steady["compute_s"] - compiling)
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


def collective_time(
    comm: pd.DataFrame | None, cell: pd.Series, collective: str, nbytes: float, factor: float, per: int = 1
) -> float | None:
    """Seconds of `collective` moving `nbytes` in `per` equal calls at comm_bench's bus bandwidth
    (bytes x factor / busbw, nccl-tests' definition); None without a comm_bench row."""
    busbw = bus_bandwidth(comm, cell["backend"], cell["env_device"], int(cell["devices"]), nbytes / per, collective)
    return nbytes * factor / (busbw * 1e9) if busbw else None


def sync_times(cell: pd.Series, comm: pd.DataFrame | None) -> tuple[float, float, str]:
    """(seconds per step of the collectives that keep the ranks in step, the same from the probe
    alone, where the first number comes from): see the module's docstring."""
    n = int(cell["devices"])
    if cell["mode"] == "ddp":
        probed = float(cell["allreduce_s"]) if pd.notna(cell["allreduce_s"]) else math.nan
        nbytes = cell["grad_bytes"]
        factor = bus_factor("all_reduce", n)
        bench = None if pd.isna(nbytes) else collective_time(comm, cell, "all_reduce", float(nbytes), factor)
    elif cell["mode"] == "fsdp" and cell["shard"] != "hybrid":  # HSDP's two levels: not modelled
        passes = 2 if cell["shard"] == "full" else 1
        parts = [cell[k] for k in ("allgather_s", "reduce_scatter_s", "gather_bytes", "grad_bytes", "units")]
        if any(pd.isna(p) for p in parts):
            return (math.nan, math.nan, "none")
        gather_s, scatter_s, gather_bytes, grad_bytes, units = (float(p) for p in parts)
        probed = passes * gather_s + scatter_s
        gather = collective_time(comm, cell, "all_gather", gather_bytes, bus_factor("all_gather", n), int(units))
        scatter = collective_time(comm, cell, "reduce_scatter", grad_bytes, bus_factor("reduce_scatter", n), int(units))
        bench = passes * gather + scatter if gather is not None and scatter is not None else None
    else:
        return (math.nan, math.nan, "none")
    if bench is not None:
        return (bench, probed, "comm_bench")
    return (probed, probed, "probe") if not math.isnan(probed) else (math.nan, math.nan, "none")


def model_cell(cell: pd.Series, part: pd.Series, base: pd.Series, comm: pd.DataFrame | None) -> dict:
    """The model of one cell; a part that was not measured is NaN and counts as 0 in the sums."""
    n = int(cell["devices"])
    steps = math.ceil(part["samples"] / n / (cell["global_batch"] / n))
    exposed = cell["sync_step_s"] - cell["nosync_step_s"]
    t_sync, probed, source = sync_times(cell, comm)
    overlap = float(np.clip(1 - exposed / probed, 0, 1)) if probed > 0 else math.nan
    sync_s = steps * t_sync * (1 - (0.0 if math.isnan(overlap) else overlap))
    dp = math.nan
    transfers = [cell[k] for k in ("scatter_s", "replicate_s", "gather_s")]
    if cell["mode"] == "dp" and not any(pd.isna(t) for t in transfers):
        dp = steps * sum(transfers)
    compute, wait = base["compute_s"] / n, part["data_wait_s"]
    predicted = compute + wait + np.nansum([sync_s, dp])
    ideal, measured = base["wall_s"] / n, part["wall_s"]
    # Measured: the collectives' time the step left exposed, read from the cell's trace where it
    # has one (dpstudy.engine.trace_figures), else the probe's step with them minus without; and the
    # forward and backward without them against b's compute split n ways. Else the model's term.
    traced = cell.get("trace_exposed_comm_s", math.nan)
    if pd.notna(traced):
        sync, exposed_source = steps * traced, "trace"
    elif pd.notna(exposed):
        sync, exposed_source = steps * exposed, "probe"
    else:
        sync, exposed_source = sync_s, "model"
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
        "sync_s": sync_s,
        "sync_source": source,
        "exposed_source": exposed_source,
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
    numeric = [c for c in COLUMNS if c not in ("cell", "sync_source", "exposed_source", "largest", *SETTING_KEYS)]
    grouped = table.groupby(SETTING_KEYS, dropna=False, sort=True)
    out = grouped[numeric].median().join(grouped[["sync_source", "exposed_source"]].first())
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
