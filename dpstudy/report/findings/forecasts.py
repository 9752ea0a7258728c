"""What would N give? The step model's forecasts (dpstudy.analysis.forecast) checked on this study: every
measured DDP and FSDP setting forecast from the others, beside what it measured (the forecasts
table)."""

from __future__ import annotations

import pandas as pd

from dpstudy.report.findings.phrases import Tables, dataset_model, listed, not_measured, percent, setup_name
from dpstudy.report.text import significant

INTRO = (
    "Each DDP or FSDP setting below was forecast from the study's other settings of its forecast "
    "group (the same data, model and settings at any batch), its own cells never read "
    "(leave-one-out): a single device's step at the per-device batch (a "
    "line through the measured batches), slowed by how much n ranks sharing this host slow one rank "
    "(from the other settings of its kind at n, or DDP's where none of its kind ran), plus the "
    "communication backward did not hide: DDP's all-reduce of each bucket, FSDP's all-gather and "
    "reduce-scatter of each unit, each priced by the latency + size / bandwidth fit of comm_bench's "
    "sweep. Memory per device is the fullest device's step peak, a line in the per-device batch "
    "through the single-device settings by PyTorch's tracker (the model's state divided by n under "
    "FSDP) plus what the strategy holds beyond them and, on CUDA, what the allocator held beyond the "
    "tracker on the measured cells (workspaces, resident data): a forecast of max_memory_allocated. The "
    "95 % interval is the model's own leave-one-out error on this study (at least the settings' "
    "noise), wider where it extrapolates."
)


def head(r) -> str:
    """ "- synthetic/lenet, DDP (gloo) on 8 devices at batch 256" """
    setup = setup_name(r["mode"], r["backend"], int(r["devices"]), 1, r.get("shard"))
    name = f"{setup} at batch {int(r['global_batch'])}"
    return f"- {dataset_model(r)}, {name}"


def extrapolation(r) -> str:
    """ "; extrapolated: <what beyond the measured>" ("" for an interpolated forecast)."""
    return "" if r["how"] == "interpolated" else f"; extrapolated: {r['basis'].split('; ', 2)[-1]}"


def memory(r, measured: bool) -> str:
    """ "; memory 41.0 MB per device (95 % 38.0-44.0), measured 40.0: error +2.5 %" ("" without a forecast)."""
    if pd.isna(r.get("predicted_memory_mb")):
        return ""
    told = f"; memory {significant(r['predicted_memory_mb'])} MB per device"
    if pd.notna(r.get("predicted_memory_low")):
        told += f" (95 % {significant(r['predicted_memory_low'])}-{significant(r['predicted_memory_high'])})"
    if measured and pd.notna(r.get("memory_error")):
        told += f", measured {significant(r['measured_memory_mb'])}: error {r['memory_error'] * 100:+.1f} %"
    return told


def fit(r) -> str:
    """ "; fits 80 GiB (needs 12.3)" / "; does **not** fit 80 GiB (needs 93.1)" ("" where unknown)."""
    if pd.isna(r.get("fits")):
        return ""
    need, room = significant(r["need_mb"] / 1024), f"{r['capacity_mb'] / 1024:.3g}"
    return f"; {'fits' if r['fits'] else 'does **not** fit'} {room} GiB (needs {need})"


def line(r) -> str:
    how = extrapolation(r)
    return (
        f"{head(r)}: forecast {significant(r['predicted_samples_per_s'])} samples/s "
        f"(95 % {significant(r['predicted_low'])}-{significant(r['predicted_high'])}), measured "
        f"{significant(r['measured_samples_per_s'])}: error {r['error'] * 100:+.1f} %{memory(r, True)}{how}."
    )


def in_tokens(r) -> str:
    """ ", 131,000 tokens/s (95 % ...)" for a text workload's forecast (utilisation.forecasts_in_tokens)."""
    if pd.isna(r.get("predicted_tokens_per_s", float("nan"))):
        return ""
    low, high = significant(r["predicted_tokens_low"]), significant(r["predicted_tokens_high"])
    return f", {significant(r['predicted_tokens_per_s'])} tokens/s (95 % {low}-{high})"


def requested_line(r) -> str:
    if r["how"] == "not forecast":
        return f"{head(r)}: not forecast: {r['basis']}."
    how = extrapolation(r)
    return (
        f"{head(r)}: {significant(r['predicted_samples_per_s'])} samples/s (95 % "
        f"{significant(r['predicted_low'])}-{significant(r['predicted_high'])}){in_tokens(r)}, "
        f"{r['predicted_speedup']:.2f}x one device{memory(r, False)}{fit(r)}{how}."
    )


def fitting_counts(asked: pd.DataFrame) -> str:
    """Per forecast dataset, model, mode, shard, backend and batch with a capacity: from which device
    count it fits, or that it fits at none or at every count forecast ("" where no forecast knows a
    capacity)."""
    known = asked.dropna(subset=["fits"])
    sentences = []
    keys = ["dataset", "model", "mode", "shard", "backend", "global_batch"]
    for _, group in known.groupby([k for k in keys if k in known], dropna=False, sort=True):
        group = group.sort_values("devices")
        counts = [int(n) for n in group["devices"]]
        fitting = [int(n) for n, ok in zip(group["devices"], group["fits"], strict=True) if ok]
        first = group.iloc[0]
        what = f"{head(first).removeprefix('- ').rsplit(' on ', 1)[0]} at batch {int(first['global_batch'])}"
        if not fitting:
            told = f"fits at none of {listing(counts)} devices"
        elif len(fitting) == len(counts):
            told = f"fits at every count forecast ({listing(counts)} devices)"
        else:
            told = f"fits at {listing(fitting)} of {listing(counts)} devices"
        sentences.append(f"{what} {told}")
    if not sentences:
        return ""
    room = f"{known['capacity_mb'].iloc[0] / 1024:.3g}"
    return (
        f"Will it fit in {room} GiB per device (the forecast memory + 10 % and, on CUDA, the context): "
        + "; ".join(sentences)
        + "."
    )


def listing(counts: list[int]) -> str:
    return ", ".join(str(n) for n in counts)


def forecasts(tables: Tables) -> str:
    """The leave-one-out forecasts and the model's error on this study, then the forecasts the
    study's forecast: block asks for."""
    asked = tables["forecasts"][tables["forecasts"]["source"] == "requested"]
    checked = held_out(tables["forecasts"][tables["forecasts"]["source"] == "leave-one-out"])
    if asked.empty:
        return checked
    lines = ["Forecasts of settings not run (the study's `forecast:`; the interval is the error above):", ""]
    fitting = fitting_counts(asked)
    return "\n".join(
        [checked, "", *lines, *(requested_line(r) for _, r in asked.iterrows()), *(["", fitting] * bool(fitting))]
    )


def held_out(table) -> str:
    if table.empty:
        return not_measured(
            "a forecast is checked on two or more DDP settings of one forecast group over 2 or more ranks, "
            "beside its single-device settings and comm_bench's all-reduce"
        )
    errors = table["error"].abs()
    inside = (table["predicted_low"] <= table["measured_samples_per_s"]) & (
        table["measured_samples_per_s"] <= table["predicted_high"]
    )
    summary = (
        f"Over {len(table)} held-out setting(s): median |error| {percent(errors.median(), 1)}, largest "
        f"{percent(errors.max(), 1)}; {int(inside.sum())} of {len(table)} measured inside their interval."
    )
    return "\n".join([INTRO, "", *listed(table.assign(abs_error=errors), line, "abs_error"), "", summary])
