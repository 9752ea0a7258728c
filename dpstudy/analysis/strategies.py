"""Which strategy for this model on this hardware: every way the study trained one workload, side
by side, ranked, with the memory each needs per device and the model's reason for the order.

A workload is a setting up to its strategy. The strategy keys (STRATEGY_KEYS: mode, devices per
node, nodes, backend, shard and hybrid's replicate, compile, batch scope, lr scaling and DDP's knobs)
vary within a workload; every other setting key (dataset, model, global batch, precision, ..., the
device kind) is the workload's, so strategies are compared at the same global batch. The
`strategies` table has one row per strategy the study asked for, run or not:

  status, reason      ok when any repeat finished (the numbers are its finished repeats'); else the
                      first repeat's status and reason
  fits                True: it ran; False: it does not fit (out of memory, or skipped by the memory
                      plan under the study's memory_budget_gib); empty: it could not run for another
                      reason (no GPU, no NCCL, ...)
  samples_per_s       the setting's throughput (geometric mean of repeats, 95 % interval:
                      dpstudy.analysis.stats), `setting` its number in the settings table
  tokens_per_s, mfu   the same in tokens/s (text; all devices, and per device) and model FLOPs
                      utilisation, with the same interval, and a text's perplexity
                      (dpstudy.analysis.utilisation)
  vs_one_device       its throughput over the workload's one-device eager setting (mode single,
                      compile false), Welch's interval on log throughput; the reference itself is 1 (no interval)
  memory_mb           one training step's peak on the fullest device (PyTorch's tracker,
                      dpstudy.engine.memory; median of the repeats), `memory_min_mb` the emptiest
                      device's, `predicted_memory_mb` the memory plan's for the fullest device
  rank                1 = the fastest finished strategy of the workload, by throughput
  vs_next             its throughput over the next-ranked one's with the interval, and `vs_next_claim`
                      (+1: faster beyond noise, 0: within noise or no interval)
  predicted_samples_per_s, model_rank, model_misorders, model_agrees
                      the step model's throughput, held out: a multi-device setting's forecast from
                      the study's other settings (dpstudy.analysis.forecast_table, leave-one-out;
                      none where nothing else calibrates it), a one-device setting its own; the
                      rank it gives; the settings this one beat beyond noise that the model puts
                      ahead of it; and whether the model orders the workload as measured (no such
                      pair: ties within noise may go either way)
  largest, largest_s  the step model's largest loss against n x and its seconds per step
                      (multi-device: dpstudy.analysis.scaling)
  learned             False when a finished repeat did not learn (dpstudy.record.learning), else True
  fastest             the fastest strategy that fits and learned: rank 1, or the best-ranked one that
                      learned when rank 1 did not (one that did not fit did not run)
"""

from __future__ import annotations

import math

import pandas as pd

from dpstudy.analysis import stats
from dpstudy.analysis.keys import DERIVED_KEYS, STRATEGY_KEYS, WORKLOAD_KEYS
from dpstudy.record.fields import BUDGET_MARK
from dpstudy.study import modes

# the throughput in work, per setting with its interval (dpstudy.analysis.utilisation)
THROUGHPUTS = ("tokens_per_s", "tokens_per_s_per_device", "mfu")
COLUMNS = (
    "workload_id",
    *WORKLOAD_KEYS,
    *STRATEGY_KEYS,
    *DERIVED_KEYS,
    "cells",
    "status",
    "reason",
    "fits",
    "setting",
    "repeats",
    "samples_per_s",
    "samples_per_s_low",
    "samples_per_s_high",
    "tokens_per_s",
    "tokens_per_s_low",
    "tokens_per_s_high",
    "tokens_per_s_per_device",
    "tokens_per_s_per_device_low",
    "tokens_per_s_per_device_high",
    "mfu",
    "mfu_low",
    "mfu_high",
    "perplexity",
    "vs_one_device",
    "vs_one_device_low",
    "vs_one_device_high",
    "memory_mb",
    "memory_min_mb",
    "predicted_memory_mb",
    "rank",
    "vs_next",
    "vs_next_low",
    "vs_next_high",
    "vs_next_claim",
    "predicted_samples_per_s",
    "model_rank",
    "model_agrees",
    "model_misorders",
    "largest",
    "largest_s",
    "learned",
    "fastest",
)


def with_device_kind(cells: pd.DataFrame) -> pd.DataFrame:
    """cells whose env_device is unknown (a launcher's skipped or failed record: no rank ran) take
    the device kind their workload's other cells ran on, when that is one kind."""
    others = [k for k in WORKLOAD_KEYS if k != "env_device"]
    known = (
        cells.dropna(subset=["env_device"])
        .groupby(others, dropna=False)["env_device"]
        .agg(lambda kinds: kinds.iloc[0] if kinds.nunique() == 1 else None)
    )
    if known.empty:
        return cells
    fill = cells.join(known.rename("workload_device"), on=others)["workload_device"]
    return cells.assign(env_device=cells["env_device"].fillna(fill))


def peaks(split: pd.DataFrame) -> pd.DataFrame:
    """Per cell: the tracker's peak on its fullest and emptiest device, and the plan's fullest."""
    per_cell = split.groupby("cell")
    return pd.DataFrame(
        {
            "memory_mb": per_cell["peak_mb"].max(),
            "memory_min_mb": per_cell["peak_mb"].min(),
            "predicted_memory_mb": per_cell["predicted_peak_mb"].max(),
        }
    )


def fits(statuses: pd.Series, reasons: pd.Series) -> bool | None:
    if (statuses == "ok").any():
        return True
    budget = reasons.fillna("").str.contains(BUDGET_MARK, regex=False)
    if (statuses == "oom").any() or ((statuses == "skipped") & budget).any():
        return False
    return None


def strategy_rows(cells: pd.DataFrame, split: pd.DataFrame) -> pd.DataFrame:
    """One row per workload and strategy: what the cells say, whatever their status."""
    cells = with_device_kind(cells).join(peaks(split), on="cell")
    rows = []
    keys = [*WORKLOAD_KEYS, *STRATEGY_KEYS]
    for key, group in cells.sort_values("cell").groupby(keys, dropna=False, sort=True):
        ok = group[group["status"] == "ok"]
        first = (ok if not ok.empty else group).iloc[0]
        rows.append(
            {
                **dict(zip(keys, key)),
                **{k: first[k] for k in DERIVED_KEYS},
                "cells": " ".join(group["cell"]),
                "status": first["status"],
                "reason": first["reason"] if ok.empty else next(iter(group["reason"].dropna()), None),
                "fits": fits(group["status"], group["reason"]),
                "memory_mb": ok["memory_mb"].median(),
                "memory_min_mb": ok["memory_min_mb"].median(),
                "predicted_memory_mb": group["predicted_memory_mb"].max(),
                "samples": ok["samples_per_s"].dropna().tolist(),
                "learned": stats.learned(ok),
            }
        )
    return pd.DataFrame(rows)


def strategies_table(
    cells: pd.DataFrame,
    settings: pd.DataFrame,
    model: pd.DataFrame,
    split: pd.DataFrame,
    held_out: pd.Series | None = None,
) -> pd.DataFrame:
    """The `strategies` table (see the module docstring) from the cells, settings, scaling_settings
    and memory_split tables and the held-out forecasts (join_model)."""
    if cells.empty:
        return pd.DataFrame(columns=list(COLUMNS))
    table = strategy_rows(cells, split)
    table = join_settings(table, settings)
    table = join_model(table, model, settings, held_out)
    parts = [rank(workload) for _, workload in table.groupby(list(WORKLOAD_KEYS), dropna=False, sort=True)]
    table = pd.concat(parts, ignore_index=True)
    table["workload_id"] = table.groupby(list(WORKLOAD_KEYS), dropna=False, sort=True).ngroup()
    table = table.astype({"rank": "Int64", "model_rank": "Int64", "setting": "Int64", "repeats": "Int64"})
    return table.reindex(columns=list(COLUMNS)).sort_values(["workload_id", "rank", "cells"], ignore_index=True)


def join_settings(table: pd.DataFrame, settings: pd.DataFrame) -> pd.DataFrame:
    """The settings table's number, repeats and throughput interval of each finished strategy."""
    keys = [*WORKLOAD_KEYS, *STRATEGY_KEYS]
    rates = [f"{m}{p}" for m in ("samples_per_s", *THROUGHPUTS) for p in ("", "_low", "_high")]
    wanted = ["setting", "repeats", *rates, "perplexity"]
    columns = [c for c in wanted if c in settings.columns]  # a settings table without utilisation: no THROUGHPUTS
    if settings.empty:
        return table.assign(**{c: math.nan for c in columns})
    found = settings.drop_duplicates(subset=keys)[[*keys, *columns]]
    # merge, not join on a MultiIndex: pandas 3.0 fails to join on an index level that is all NaN
    # (a key no setting sets), where merge matches NaN with NaN as join did
    return table.merge(found, on=keys, how="left", validate="many_to_one").set_axis(table.index)


def join_model(
    table: pd.DataFrame, model: pd.DataFrame, settings: pd.DataFrame, held_out: pd.Series | None = None
) -> pd.DataFrame:
    """The step model's throughput of each finished strategy, never read from its own cells: a
    multi-device setting's forecast from the others (`held_out`, by setting number:
    forecast_table.held_out_by_setting; none where no other setting calibrates it), a one-device
    setting its own throughput (the model's t1 is measured there); and the breakdown's largest loss
    against n x (`model`, the scaling_settings table)."""
    out = table.assign(predicted_samples_per_s=math.nan, largest=None, largest_s=math.nan)
    if settings.empty:
        return out
    by_number = settings.set_index("setting")
    predicted = model.set_index("setting") if not model.empty else pd.DataFrame()
    held_out = held_out if held_out is not None else pd.Series(dtype=float)
    for i, row in out.iterrows():
        if pd.isna(row["setting"]):
            continue
        number = int(row["setting"])
        setting = by_number.loc[number]
        if row["mode"] == modes.BASELINE and setting["devices"] == 1:
            out.at[i, "predicted_samples_per_s"] = setting["samples_per_s"]  # its own baseline
        elif number in held_out.index:
            out.at[i, "predicted_samples_per_s"] = held_out[number]
        if number in predicted.index:
            m = predicted.loc[number]
            out.at[i, "largest"], out.at[i, "largest_s"] = m["largest"], m["largest_s"]
    return out


def rank(workload: pd.DataFrame) -> pd.DataFrame:
    """One workload's strategies ranked by throughput and by the model, each against the next and
    against one device eager."""
    out = workload.copy()
    finished = out["samples_per_s"].notna()
    out["rank"] = out["samples_per_s"].where(finished).rank(ascending=False, method="first")
    out["model_rank"] = out["predicted_samples_per_s"].rank(ascending=False, method="first")
    out["model_misorders"] = misorders(out)
    has_prediction = out["predicted_samples_per_s"].notna() & finished
    out["model_agrees"] = out["model_misorders"].isna().all() if has_prediction.sum() >= 2 else None
    # a strategy that did not learn is no candidate: the fastest is the best ranked one that did
    candidates = out["rank"].where(out["learned"].fillna(True).astype(bool))
    out["fastest"] = candidates == candidates.min()
    reference = out[(out["mode"] == modes.BASELINE) & (out["devices"] == 1) & ~out["compile"].astype(bool) & finished]
    base = reference["samples"].iloc[0] if len(reference) == 1 else []
    for column in ("vs_one_device", "vs_next"):
        for part in ("", "_low", "_high"):
            out[column + part] = math.nan
    out["vs_next_claim"] = pd.array([pd.NA] * len(out), dtype="Int64")
    order = out[finished].sort_values("rank")
    for (i, row), nxt in zip(order.iterrows(), [*order["samples"].iloc[1:], None]):
        if base and i in reference.index:  # the reference against itself: exactly 1, no noise to speak of
            out.loc[i, "vs_one_device"] = 1.0
        elif base:
            out.loc[i, ["vs_one_device", "vs_one_device_low", "vs_one_device_high"]] = stats.ratio(row["samples"], base)
        if nxt is not None:
            value = stats.ratio(row["samples"], nxt)
            out.loc[i, ["vs_next", "vs_next_low", "vs_next_high"]] = value
            out.loc[i, "vs_next_claim"] = stats.versus(value, 1.0)
    return out.drop(columns="samples")


def fastest(strategies: pd.DataFrame) -> pd.DataFrame:
    """The fastest strategy of each workload (rank 1), in workload order."""
    return strategies[strategies["fastest"].astype(bool)].sort_values("workload_id")


def ranked(strategies: pd.DataFrame, workload: int) -> pd.DataFrame:
    """One workload's finished strategies, fastest first."""
    rows = strategies[(strategies["workload_id"] == workload) & strategies["rank"].notna()]
    return rows.sort_values("rank")


def misorders(workload: pd.DataFrame) -> list[str | None]:
    """Per strategy: the settings (numbers, space-separated) that measured slower than it beyond
    noise but that the model predicts faster; None where there is none or no prediction."""
    predicted = workload.dropna(subset=["samples_per_s", "predicted_samples_per_s"])
    out = []
    for _, row in workload.iterrows():
        if pd.isna(row["predicted_samples_per_s"]) or pd.isna(row["samples_per_s"]):
            out.append(None)
            continue
        wrong = [
            str(int(other["setting"]))
            for _, other in predicted.iterrows()
            if stats.versus(stats.ratio(row["samples"], other["samples"]), 1.0) == 1
            and other["predicted_samples_per_s"] > row["predicted_samples_per_s"]
        ]
        out.append(" ".join(wrong) or None)
    return out
