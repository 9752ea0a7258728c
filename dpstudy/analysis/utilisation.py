"""Tokens/s, achieved FLOP/s and MFU: what a cell's throughput means in work done, per cell and
per setting with the setting's interval.

A cell's record says what one sample costs (`cost`: tokens and FLOPs per sample, dpstudy.engine.cost).
Throughput times it is the work per second; MFU (model FLOPs utilisation) divides the model's
FLOP/s by the peak of every device of the cell at its precision: on CUDA the datasheet's dense peak
of the device the record names (dpstudy.util.peaks; a device not in the table gets no MFU and the
reason, never another device's peak), on a CPU the machine's measured matmul rate (the floor's
`compute_gflops` per thread it ran on, the median over the study's floor runs, times the cores
the cell's ranks ran on: the distinct cores they were pinned to, `cores`; 4 ranks on 2 cores have
2), so a CPU's MFU is "of the measured peak". HFU counts the recomputed forward of activation
checkpointing too. Tokens/s is never divided by a sharding degree: it is the cell's, all devices
together, and per device is that over the devices.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dpstudy.util import peaks

COST_COLUMNS = ("task", "tokens_per_sample", "flops_per_sample", "hardware_flops_per_sample", "flops_reason")
CELL_COLUMNS = (
    "tokens_per_s",
    "tokens_per_s_per_device",
    "model_tflops",
    "peak_tflops",
    "peak_source",
    "mfu",
    "hfu",
    "mfu_reason",
    "final_test_loss",
    "perplexity",
)
# per setting: the summary's throughput interval scaled by the setting's constants
SETTING_METRICS = ("tokens_per_s", "tokens_per_s_per_device", "mfu")


def cost_columns(rec: dict) -> dict:
    """The record's `cost` as cells.csv columns (records made before it have none)."""
    cost = rec.get("cost") or {}
    return {k: cost.get(k) for k in COST_COLUMNS}


def cores_used(env: dict) -> int | None:
    """Cores a CPU cell's ranks ran on: the distinct cores its ranks were pinned to, per node (ranks
    past the job's cores are not pinned and share those); None where no rank recorded its cores."""
    pinned = {
        (r.get("node") or r.get("hostname"), core) for r in env.get("ranks") or [] for core in r.get("cores") or []
    }
    return len(pinned) or None


def floor_peak(floor: pd.DataFrame | None) -> tuple[float | None, str]:
    """(the machine's measured matmul TFLOP/s per core, what it is) from the floor table's CPU runs:
    each run's rate over the threads it ran on, their median."""
    runs = floor[floor["device"] == "cpu"] if floor is not None and len(floor) else None
    if runs is None or runs["compute_gflops"].notna().sum() == 0:
        return None, "no floor run measured this machine's matmul rate (config bench.floor; it needs two repeat rounds)"
    per_core = (runs["compute_gflops"] / runs["threads"].clip(lower=1)).dropna()
    rate = float(np.median(per_core)) / 1e3
    runs_text = f"median of {len(per_core)} run{'s' if len(per_core) > 1 else ''}"
    return rate, f"the measured peak: the floor's matmul rate, {rate * 1e3:.3g} GFLOP/s per core ({runs_text})"


def cell_peak(row: pd.Series, cpu_peak: tuple[float | None, str]) -> tuple[float | None, str]:
    """(the cell's peak TFLOP/s, all its devices, at its precision; its source or why none)."""
    if row.get("env_device") == "cpu":
        per_core, source = cpu_peak
        if row.get("precision", "fp32") != "fp32":  # bf16 matmuls run at another rate, unmeasured
            return None, f"a CPU's peak is the floor's fp32 matmul rate, and this cell ran {row.get('precision')}"
        cores = row.get("cores")  # else, for records without pinned cores, one thread per core
        if cores is None or pd.isna(cores):
            cores = row.get("threads_per_process", math.nan) * row.get("world_size", math.nan)
        if per_core is None or pd.isna(cores):
            return None, source if per_core is None else "the record does not say how many cores the cell ran on"
        return per_core * cores, f"{source} x {cores:g} cores"
    names = [n.strip() for n in str(row.get("gpu_names") or "").split(";") if n.strip()]
    if not names:
        return None, "the record names no GPU"
    peak = peaks.lookup(names[0])
    if peak is None:
        return None, f"{names[0]} is not in the peak table (dpstudy/util/peaks.py)"
    per_device = peak.tflops(row.get("precision") or "fp32")
    if per_device is None:
        return None, f"the {peak.label} datasheet gives no dense {row.get('precision')} peak"
    source = f"{peak.label} datasheet, dense {row.get('precision')}: {per_device:g} TFLOP/s per device"
    return per_device * row["devices"], source


def with_utilisation(cells: pd.DataFrame, floor: pd.DataFrame | None) -> pd.DataFrame:
    """cells with CELL_COLUMNS filled (NaN where they do not apply)."""
    cells = cells.copy()
    throughput = cells["samples_per_s"].astype(float)
    tokens = pd.to_numeric(cells["tokens_per_sample"], errors="coerce")
    cells["tokens_per_s"] = throughput * tokens
    cells["tokens_per_s_per_device"] = cells["tokens_per_s"] / cells["devices"].astype(float)
    cells["model_tflops"] = throughput * pd.to_numeric(cells["flops_per_sample"], errors="coerce") / 1e12
    cpu_peak = floor_peak(floor)
    found = [cell_peak(row, cpu_peak) for _, row in cells.iterrows()]
    cells["peak_tflops"] = [p if p is not None else math.nan for p, _ in found]
    cells["peak_source"] = [source if p is not None else None for p, source in found]
    cells["mfu"] = cells["model_tflops"] / cells["peak_tflops"]
    hardware = pd.to_numeric(cells["hardware_flops_per_sample"], errors="coerce")
    cells["hfu"] = throughput * hardware / 1e12 / cells["peak_tflops"]
    cells["mfu_reason"] = [
        None if pd.notna(mfu) else reason_without(row, source)
        for (_, row), (_, source), mfu in zip(cells.iterrows(), found, cells["mfu"], strict=True)
    ]
    text = cells["task"] == "text"
    cells["perplexity"] = np.where(text, np.exp(cells["final_test_loss"].astype(float)), np.nan)
    return cells


def reason_without(row: pd.Series, peak_source: str) -> str | None:
    if pd.isna(row["samples_per_s"]):
        return None  # nothing measured: the status says why
    if pd.isna(row.get("flops_per_sample")):
        return row.get("flops_reason") or "the record has no FLOP count (made before dpstudy counted them)"
    return peak_source


def settings_with_utilisation(settings: pd.DataFrame, cells: pd.DataFrame) -> pd.DataFrame:
    """settings with tokens/s (all devices, and per device) and MFU, each with the throughput's
    interval: within a setting the tokens and FLOPs per sample and the peak are constants, so each
    is samples/s times one number; and a text's perplexity."""
    settings = settings.copy()
    finished = cells[cells["status"] == "ok"]
    per_setting = {
        cell: (row["tokens_per_sample"], row["flops_per_sample"], row["peak_tflops"])
        for cell, row in finished.set_index("cell")[["tokens_per_sample", "flops_per_sample", "peak_tflops"]].iterrows()
    }
    factors = {metric: [] for metric in SETTING_METRICS}
    losses = finished.set_index("cell")["final_test_loss"].astype(float)
    perplexity = []
    for names, devices in zip(settings["cells"], settings["devices"], strict=True):
        own = str(names).split(" ")
        first = per_setting.get(own[0], (math.nan,) * 3)
        tokens, flops, peak = (pd.to_numeric(v, errors="coerce") for v in first)
        factors["tokens_per_s"].append(tokens)
        factors["tokens_per_s_per_device"].append(tokens / devices)
        factors["mfu"].append(flops / 1e12 / peak if pd.notna(peak) and peak else math.nan)
        # a text's perplexity: exp of the repeats' mean test loss (nats per token)
        perplexity.append(math.exp(losses.reindex(own).mean()) if pd.notna(tokens) else math.nan)
    for metric in SETTING_METRICS:
        factor = np.asarray(factors[metric], dtype=float)
        for part in ("", "_low", "_high"):
            settings[f"{metric}{part}"] = settings[f"samples_per_s{part}"].astype(float) * factor
    settings["perplexity"] = perplexity
    return settings


# a forecast's throughput in tokens: what the forecast group's cells train on per sample
TOKEN_GROUP = ("dataset", "model", "model_args", "seq_len")


def group_key(row: pd.Series, keys: list[str]) -> tuple[str, ...]:
    def text(value) -> str:
        if value is None or (not isinstance(value, str) and pd.isna(value)):
            return ""
        return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)

    return tuple(text(row[k]) for k in keys)


def forecasts_in_tokens(forecasts: pd.DataFrame, cells: pd.DataFrame) -> pd.DataFrame:
    """forecasts with predicted_tokens_per_s (and its interval) and measured_tokens_per_s: samples/s
    times the tokens per sample of the group's cells (text workloads; NaN for images)."""
    forecasts = forecasts.copy()
    keys = [k for k in TOKEN_GROUP if k in forecasts and k in cells]
    known = cells.dropna(subset=["tokens_per_sample"]) if "tokens_per_sample" in cells else cells.iloc[:0]
    # matched as text: the tables hold seq_len as Int64, float or object depending on how they were made
    per_group = {group_key(row, keys): float(row["tokens_per_sample"]) for _, row in known.iterrows()}
    tokens = pd.Series([per_group.get(group_key(row, keys), math.nan) for _, row in forecasts.iterrows()])
    tokens.index = forecasts.index
    for column, source in (
        ("predicted_tokens_per_s", "predicted_samples_per_s"),
        ("predicted_tokens_low", "predicted_low"),
        ("predicted_tokens_high", "predicted_high"),
        ("measured_tokens_per_s", "measured_samples_per_s"),
    ):
        forecasts[column] = pd.to_numeric(forecasts[source], errors="coerce") * tokens
    return forecasts
