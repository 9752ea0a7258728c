"""Item 8 of `make gpu-check`: on one GPU, the forecasts checked against cells that ran.

A small study (STUDY: two models, four batch sizes, one device, two repeats, `device: cuda`) runs
through real Snakemake in a copy of the checkout (its own results/, the default study's left
alone), up to its tables. Then, from those tables:

- batch forecasts: per model, the single-device step time through the smallest and the largest
  batch (dpstudy.analysis.linefit.StepTime, overlapped as on CUDA, as dpstudy.analysis.forecast
  calibrates t1), the throughput it gives at each batch between them against what that batch
  measured;
- memory: the memory plan's allocator peak (made before training, on fake tensors, with cuBLAS's
  and cuDNN's workspaces measured on this GPU: dpstudy.workflow.workspaces) against each cell's
  max_memory_allocated (memory_split, `against` allocator); then the forecast as
  dpstudy.analysis.forecast makes it, the plan plus what the allocator held beyond it on the
  model's other batches (their median: the library workspaces no fake step sees); and the cells
  the plan let through that ran out of memory (none may);
- the edge cell: resnet18 at the largest batch whose need (the plan's allocator peak with the
  budget's margins, dpstudy.study.budget) is at most EDGE_SHARE of this GPU's memory: it must run
  without running out of memory (edge_sweep picks the batch on this host before the study runs);
- what the allocator and the driver held beside it: reserved over allocated, the CUDA context;
- the single-device cells' noise (CV over repeats) on this GPU, beside the machine's floor (its
  reference workload's CV over the study's rounds, dispatch included: what bounds a small model's
  step on CUDA is the host launching its kernels).

`evaluate(tables)` is pure, so it is tested without a GPU.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from dpstudy.analysis.linefit import StepTime
from dpstudy.data.task import Task
from dpstudy.gpucheck.study import noise_figures, run_in_copy
from dpstudy.study import modes

# Epochs per model: a cell's steady window (every step after the warm-up) of at least about a
# second on an H100. 8,192 images a cell, as before, gave simplecnn windows of 30-200 ms and
# repeats 6-12 % apart (resnet18 at batch 128: 20 %), noise that no forecast can be checked against.
EPOCHS = {"resnet18": 3, "simplecnn": 8}
BATCHES = (128, 256, 512, 1024)
STUDY = {
    "study": "gpucheck_forecast",
    "device": "cuda",
    "datasets": {"synthetic_rgb": {"train_size": 32768, "test_size": 1024}},
    "defaults": {"repeats": 2, "loader": "device", "optimizer": "adam", "lr": 0.001},
    "bench": {"kernels": False, "comm": False},
    "sweeps": [
        {
            "name": model,
            "dataset": "synthetic_rgb",
            "model": model,
            "grid": {"mode": ["single"], "batch": [*BATCHES]},
            "set": {"epochs": epochs},
        }
        for model, epochs in EPOCHS.items()
    ],
}
TABLES = ("settings", "cells", "memory_split", "summary", "floor")
EDGE_SHARE = 0.9  # the edge cell's predicted need, as a share of the device's memory
EDGE_STEP = 256  # its batch: a multiple of this
SYNTHETIC = Task.image(1, 28, 10)  # the edge cell's dataset, `synthetic`


def batch_forecasts(settings: pd.DataFrame) -> pd.DataFrame:
    """Per model, the throughput at each inner batch from the line through the outer two."""
    single = settings[(settings["mode"] == modes.BASELINE) & (settings["devices"] == 1)].dropna(
        subset=["samples_per_s"]
    )
    rows = []
    for (_, model), own in single.groupby(["dataset", "model"]):
        own = own.sort_values("global_batch")
        if len(own) < 3:
            continue
        ends = own.iloc[[0, -1]]
        on_cuda = bool((own["env_device"] == "cuda").all())
        step_time = StepTime.fit(ends["global_batch"], ends["global_batch"] / ends["samples_per_s"], on_cuda)
        for _, row in own.iloc[1:-1].iterrows():
            b = float(row["global_batch"])
            predicted = b / step_time(b)
            rows.append(
                {
                    "model": model,
                    "batch": int(b),
                    "predicted_samples_per_s": predicted,
                    "measured_samples_per_s": row["samples_per_s"],
                    "error": predicted / row["samples_per_s"] - 1,
                    "noise_cv": row["noise_cv"],
                }
            )
    return pd.DataFrame(rows)


def calibrated_memory(checked: pd.DataFrame, cells: pd.DataFrame) -> pd.Series:
    """Per row of `checked` (memory_split rows against the allocator): the plan's allocator peak
    plus the median of (measured - planned) over the same model's other batches, relative error
    against max_memory_allocated; NaN where the model ran no other batch."""
    rows = checked.merge(cells[["cell", "dataset", "model", "batch"]], on="cell", how="left")
    gap = rows["allocated_mb"] - rows["predicted_allocated_mb"]
    errors = []
    for _, row in rows.iterrows():
        same = (rows["dataset"] == row["dataset"]) & (rows["model"] == row["model"])
        others = gap[same & (rows["batch"] != row["batch"])]
        predicted = row["predicted_allocated_mb"] + others.median() if len(others) else float("nan")
        errors.append(predicted / row["allocated_mb"] - 1)
    return pd.Series(errors, index=checked.index)


def edge_sweep(total_mb: float, predict=None) -> dict:
    """The edge cell's sweep, dataset and predicted need on a device of `total_mb`: resnet18 on
    1x28x28 images (`synthetic`, twice the batch to train on, so that every step is a full batch)
    at the largest multiple of EDGE_STEP whose need is at most EDGE_SHARE of the device. The plan's
    allocator peak is a line in the batch: two fake steps (`predict`, memory_plan.predict) give it,
    and the resident data is added for each batch's own dataset size."""
    from dpstudy.study.budget import need_of
    from dpstudy.study.spec import complete
    from dpstudy.workflow import memory_plan

    predict = predict or memory_plan.predict
    base = {"dataset": "synthetic", "model": "resnet18", "mode": "single", "device": "cuda", "optimizer": "adam"}
    # the step alone (no resident data under the torch loader): its peak at two batches
    step = {b: predict(complete({**base, "batch": b, "loader": "torch"}))["peak_mb"][0] for b in (256, 512)}
    per_sample = (step[512] - step[256]) / 256
    test = 1024
    device_loader = complete({**base, "batch": EDGE_STEP})  # the cell as it runs: the device loader

    def need(batch: int) -> float:
        resident = memory_plan.resident_mb(device_loader, SYNTHETIC, (2 * batch, test))
        return need_of(step[256] + per_sample * (batch - 256) + resident, on_cuda=True)

    batch = EDGE_STEP
    while need(batch + EDGE_STEP) <= EDGE_SHARE * total_mb:
        batch += EDGE_STEP
    sweep = {
        "name": "edge",
        "dataset": "synthetic",
        "model": "resnet18",
        "grid": {"mode": ["single"], "batch": [batch]},
        "set": {"repeats": 1, "epochs": 2},
    }
    return {"sweep": sweep, "dataset": {"train_size": 2 * batch, "test_size": test}, "need_mb": need(batch)}


def edge_figures(cells: pd.DataFrame, split: pd.DataFrame | None, edge: dict, total_mb: float) -> dict:
    """edge_ok (the edge cell ran to its record, no out-of-memory), edge_share (what its
    allocator held over the device's memory) and their details. Pure."""
    batch = edge["sweep"]["grid"]["batch"][0]
    mine = cells[(cells["dataset"] == "synthetic") & (cells["batch"] == batch)]
    status = mine["status"].iloc[0] if len(mine) else "missing"
    figures = {"edge_ok": status == "ok"}
    details = {
        "edge_ok": f"resnet18 batch {batch}: {status}; predicted need {edge['need_mb'] / 1024:.1f} GiB of "
        f"{total_mb / 1024:.1f} GiB ({edge['need_mb'] / total_mb:.0%})"
    }
    held = split[split["cell"].isin(mine["cell"])]["allocated_mb"].dropna() if split is not None else []
    if len(held):
        figures["edge_share"] = float(held.max() / total_mb)
    return {"figures": figures, "details": details}


def memory_figures(split: pd.DataFrame | None, cells: pd.DataFrame | None) -> dict:
    """The plan and the memory forecast against max_memory_allocated, the context, reserved over
    allocated (memory_split's rows against the allocator), with a note per device. Pure."""
    figures, details, notes = {}, {}, []
    checked = split[split["against"] == "allocator"] if split is not None and "against" in split else pd.DataFrame()
    if len(checked):
        errors = checked["error_pct"].abs() / 100
        figures["memory_median_error"] = float(errors.median())
        figures["memory_max_error"] = float(errors.max())
        calibrated = calibrated_memory(checked, cells).abs().dropna()
        if len(calibrated):
            figures["memory_forecast_median_error"] = float(calibrated.median())
            figures["memory_forecast_max_error"] = float(calibrated.max())
        figures["reserved_over_allocated"] = float((checked["reserved_mb"] / checked["allocated_mb"]).median())
        if checked["context_mb"].notna().any():
            figures["context_mb"] = float(checked["context_mb"].median())
        details["memory_median_error"] = (
            f"{len(checked)} devices; plan allocator peak vs max_memory_allocated, resident data "
            f"{checked['resident_mb'].median():.1f} MB median"
        )
        notes += [
            f"{r.cell}: predicted {r.predicted_allocated_mb:,.1f} MB (tracker {r.predicted_peak_mb:,.1f}, library "
            f"workspaces {_mb(getattr(r, 'predicted_workspace_mb', None))}) vs allocated {r.allocated_mb:,.1f} "
            f"(tracker {r.peak_mb:,.1f}), reserved {r.reserved_mb:,.1f}, context {r.context_mb:,.0f} MB "
            f"({r.error_pct:+.1f} %)"
            for r in checked.itertuples()
        ]
    else:
        details["memory_median_error"] = "no CUDA cell with both the plan's allocator peak and a measured one"
    return {"figures": figures, "details": details, "notes": notes}


def _mb(value) -> str:
    return "not measured" if value is None or pd.isna(value) else f"+{value:,.1f}"


def evaluate(tables: dict[str, pd.DataFrame], edge: dict | None = None, total_mb: float | None = None) -> dict:
    """Figures, details and notes from the study's tables (settings, cells, memory_split), and of
    the edge cell where `edge` (edge_sweep) and the device's `total_mb` are given. Pure."""
    settings, cells, split = (tables.get(name) for name in ("settings", "cells", "memory_split"))
    figures, details, notes = {}, {}, []
    if edge is not None and cells is not None:
        made = edge_figures(cells, split, edge, total_mb)
        figures.update(made["figures"])
        details.update(made["details"])
    forecasts = batch_forecasts(settings) if settings is not None else pd.DataFrame()
    if len(forecasts):
        errors = forecasts["error"].abs()
        figures["batch_median_error"] = float(errors.median())
        figures["batch_max_error"] = float(errors.max())
        details["batch_median_error"] = f"{len(forecasts)} inner batches of {forecasts['model'].nunique()} models"
        notes += [
            f"{r.model} batch {r.batch}: forecast {r.predicted_samples_per_s:,.0f} vs measured "
            f"{r.measured_samples_per_s:,.0f} samples/s ({r.error:+.1%}; repeats' CV {r.noise_cv:.1%})"
            for r in forecasts.itertuples()
        ]
    else:
        details["batch_median_error"] = "no model has three single-device batches measured"
    single = pd.DataFrame(columns=["noise_cv"])
    if settings is not None and "noise_cv" in settings:
        single = settings[(settings["mode"] == modes.BASELINE) & (settings["env_device"] == "cuda")].dropna(
            subset=["noise_cv"]
        )
    if len(single):
        figures["single_cv"] = float(single["noise_cv"].max())
        worst = single.loc[single["noise_cv"].idxmax()]
        details["single_cv"] = (
            f"largest of {len(single)} settings, {worst['model']} batch {int(worst['global_batch'])} "
            f"(median {single['noise_cv'].median():.2%})"
        )
    if tables.get("summary") is not None and tables.get("floor") is not None:
        floor = noise_figures(tables["summary"], tables["floor"])  # the machine's own, as item 2 reports it
        figures["floor_cv"] = floor["figures"]["floor_cv"]
        details["floor_cv"] = floor["details"]["floor_cv"]
    figures["oom_cells"] = int((cells["status"] == "oom").sum()) if cells is not None else None
    memory = memory_figures(split, cells)
    figures.update(memory["figures"])
    details.update(memory["details"])
    notes += memory["notes"]
    return {"figures": figures, "details": details, "notes": notes, "data": {"forecasts": forecasts.to_dict("records")}}


def run_forecast(out: Path) -> dict:
    """STUDY (with the edge cell) through Snakemake in a copy of the checkout, then evaluate its tables."""
    import torch

    total_mb = torch.cuda.get_device_properties(0).total_memory / 2**20
    edge = edge_sweep(total_mb)
    study = {
        **STUDY,
        "datasets": {**STUDY["datasets"], "synthetic": edge["dataset"]},
        "sweeps": [*STUDY["sweeps"], edge["sweep"]],
    }
    made = run_in_copy(out, "forecast", study, TABLES, gpus=1)
    if "settings" not in made["tables"]:
        raise RuntimeError(f"Snakemake ended (exit status {made['returncode']}) without the study's tables; see above")
    result = evaluate(made["tables"], edge, total_mb)
    result["figures"]["wall_s"] = made["wall_s"]
    return {**result, "files": made["files"], "params": {"command": made["command"][1:], "study": study}}
