"""The strategies table's forecast rows: what the study's `forecast:` block forecasts, ranked beside
what ran (issue 26: "would 8 devices of FSDP beat 2 of DDP here?").

A forecast (the forecasts table, source requested) joins the workload it belongs to: the measured
workload of its dataset, model and settings at its global batch. Its row has `forecast` True,
`status` forecast, the forecast's basis as `reason`, its throughput with the 95 % prediction
interval as samples_per_s (low, high), its speedup over one device as vs_one_device (the interval's
ratios), its memory per device as predicted_memory_mb, and no `rank`: rank, fastest and the lead
over the next stay the measured strategies'. `rank_with_forecasts` orders every row of a workload,
measured ones by their throughput and forecast ones by theirs, so a forecast that would beat the
measured fastest says so. A forecast whose global batch no measured strategy ran is left to the
forecasts table.
"""

from __future__ import annotations

import math

import pandas as pd

from dpstudy.analysis.keys import STRATEGY_KEYS, WORKLOAD_KEYS


def forecast_rows(strategies: pd.DataFrame, forecasts: pd.DataFrame) -> pd.DataFrame:
    """The requested forecasts as strategies rows of the workloads they belong to."""
    asked = forecasts[(forecasts["source"] == "requested") & (forecasts["how"] != "not forecast")]
    rows = []
    for _, made in asked.iterrows():
        workload = same_workload(strategies, made)
        if workload.empty:
            continue
        first = workload.iloc[0]
        ratio = made["predicted_speedup"] / made["predicted_samples_per_s"]
        strategy = {k: first[k] for k in STRATEGY_KEYS}  # DDP's knobs, compile and the like: the workload's
        strategy.update(mode=made["mode"], gpus=int(made["devices"]), nodes=1, backend=made["backend"])
        strategy.update(shard=made.get("shard") if isinstance(made.get("shard"), str) else "none")
        strategy["replicate"] = None  # forecasts are never hybrid (forecast.MESSAGES)
        strategy["compile"] = bool(made["compile"]) if pd.notna(made.get("compile")) else False
        rows.append(
            {
                **{k: first[k] for k in ("workload_id", *WORKLOAD_KEYS)},
                **strategy,
                "devices": int(made["devices"]),
                # the spec's batch: the global batch, or per device under batch_scope device
                "batch": int(made["global_batch"])
                // (1 if strategy["batch_scope"] == "global" else int(made["devices"])),
                "status": "forecast",
                "reason": made["basis"],
                "samples_per_s": made["predicted_samples_per_s"],
                "samples_per_s_low": made["predicted_low"],
                "samples_per_s_high": made["predicted_high"],
                "vs_one_device": made["predicted_speedup"],
                "vs_one_device_low": made["predicted_low"] * ratio,
                "vs_one_device_high": made["predicted_high"] * ratio,
                "predicted_memory_mb": made["predicted_memory_mb"],
                "fastest": False,  # the fastest is measured (strategies.rank)
                "forecast": True,
            }
        )
    return pd.DataFrame(rows)


def same_workload(strategies: pd.DataFrame, made: pd.Series) -> pd.DataFrame:
    """The strategies of the measured workload a forecast belongs to (none: empty)."""
    mask = pd.Series(True, index=strategies.index)
    for key in WORKLOAD_KEYS:
        if key in made.index:
            mask &= (strategies[key] == made[key]) | (strategies[key].isna() & pd.isna(made[key]))
    return strategies[mask]


def with_forecasts(strategies: pd.DataFrame, forecasts: pd.DataFrame) -> pd.DataFrame:
    """The strategies table with its forecast rows (see the module docstring), each workload's rows
    together, measured first."""
    table = strategies.assign(forecast=False)
    added = forecast_rows(table, forecasts) if not forecasts.empty and not table.empty else pd.DataFrame()
    if not added.empty:
        table = pd.concat([table, added.reindex(columns=table.columns)], ignore_index=True)
    throughput = table["samples_per_s"].where(table["rank"].notna() | table["forecast"].astype(bool))
    ranked = throughput.groupby(table["workload_id"]).rank(ascending=False, method="first")
    table["rank_with_forecasts"] = ranked.astype("Int64") if len(table) else pd.array([], dtype="Int64")
    table["forecast"] = table["forecast"].astype(bool)
    order = table.assign(_forecast=table["forecast"], _rank=table["rank"].astype(float).fillna(math.inf))
    order = order.sort_values(["workload_id", "_forecast", "_rank", "rank_with_forecasts"], kind="stable")
    return order.drop(columns=["_forecast", "_rank"]).reset_index(drop=True)
