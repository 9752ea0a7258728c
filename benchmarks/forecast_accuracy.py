"""How well do dpstudy's forecasts predict settings they were not calibrated on?

    .venv/bin/python benchmarks/forecast_accuracy.py --tables results/tables
    .venv/bin/python benchmarks/forecast_accuracy.py --run [--workdir /tmp/prediction-study] [--repeats 3]

--run first runs STUDY (two models, three batch sizes, one device, DDP and FSDP full and grad_op
over Gloo on 2 ranks, compile off) with Snakemake in a copy of this checkout, then evaluates its
tables; --tables evaluates a finished study's (its comm_fit.csv holds the collectives' fits).

Per forecast group (dpstudy.analysis.forecast.FORECAST_GROUP) the model is calibrated on three settings:
one device at the smallest and the largest batch, and DDP at the middle batch (or at the largest
DDP batch measured); plus the collective fits. It forecasts every other setting it can: DDP at the
other batches, FSDP full and grad_op at every batch (no FSDP cell calibrates them: they take DDP's
host share and overlap, priced with FSDP's own collectives per unit), one device at the other
batches (the line through the two). Printed per setting: the forecast with its 95 % interval
(sigma: the RMS log error of the other workloads' forecasts, never below the calibrating settings'
noise, widened where it extrapolates; the noise-only interval's coverage is printed beside it),
what was measured and the error; then the median and p90 |error|, the intervals' coverage, per
scheme (forecast.scheme_of) the same, the fastest strategy per workload and global batch among one
device, DDP and FSDP (right when it is the measured fastest or within the measured intervals of it),
and the same errors for
  linear  one device's throughput x n x the calibrating DDP setting's efficiency;
  naive   one device's step / n + the scheme's collectives by the fits, nothing hidden;
  before  the "why not n x" model (dpstudy.analysis.scaling, the scaling_settings table), which
          reads each setting's own probe: not a forecast, what the report had before.

Measured here (--run --models simplecnn,lenet, 3 repeats, 83 jobs in 15-16 min; vit takes about
100 s a cell on one core of this VM), two studies: 18 forecasts each, 12 of them FSDP; median
|error| 9.2 % and 13.9 %, p90 14.0 % and 28.6 %, coverage 78 % and 56 %, the fastest strategy right
in 6 of 6 workload-batches both times; DDP alone 2.4 / 3.3 % and 3.5 / 6.1 %; FSDP full 10.6 / 12.2 %
and 22.1 / 30.2 %, grad_op 13.8 / 14.6 % and 18.9 / 27.9 %: FSDP from one DDP setting's overlap is
the weak part. Over the 16 DDP and FSDP settings: linear 52-57 % / 229-230 %, naive 35 % / 54-57 %,
before 25-28 % / 70-247 %. A third study (2026-11-27, 16 min 36 s): median 3.4 %, p90 7.6 %,
coverage 100 % with either sigma (the track record gave lenet 7.7 % where its noise gave 4.3 %,
simplecnn 3.5 % against 3.3 %); DDP 3.6 / 4.9 %, FSDP full 4.6 / 11.3 %, grad_op 3.3 / 7.3 %; 6 of 6
fastest right; linear 51 % / 228 %, naive 56 % / 83 %, before 42 % / 268 %. A fourth (the same
day, 16 min 22 s): median 6.8 %, p90 12.1 %, coverage 100 % (noise-only sigma 94 %); DDP 7.3 / 12.6 %,
FSDP full 7.0 / 10.4 %, grad_op 9.1 / 15.1 %; 6 of 6 fastest right; linear 44 % / 227 %, naive
44 % / 77 %, before 55 % / 237 %.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dpstudy.analysis import tablefiles  # noqa: E402
from dpstudy.analysis.forecast import FORECAST_GROUP, Calibration, interval  # noqa: E402
from dpstudy.analysis.forecast_table import calibration_inputs, group_of, model_sigma  # noqa: E402

MODELS = ("simplecnn", "vit")
BATCHES = (64, 128, 256)
# the strategies of each model's sweeps: one device, DDP, FSDP full and grad_op, over Gloo on 2 ranks
STRATEGIES = {
    "one": {"mode": ["single"]},
    "ddp": {"mode": ["ddp"], "gpus": [2], "backend": ["gloo"]},
    "fsdp": {"mode": ["fsdp"], "gpus": [2], "backend": ["gloo"], "shard": ["full", "grad_op"]},
}
STUDY = {
    "study": "forecast_accuracy",
    "datasets": {"synthetic_rgb": {"train_size": 2048, "test_size": 512}},
    "defaults": {"epochs": 3, "compile": False},
    "bench": {"kernels": False, "comm": True},
}


def study(models: tuple[str, ...] = MODELS) -> dict:
    """The study --run runs: every model of `models` in every strategy at every batch of BATCHES."""
    sweeps = [
        {"name": f"{model}_{name}", "dataset": "synthetic_rgb", "model": model, "grid": {**grid, "batch": [*BATCHES]}}
        for model in models
        for name, grid in STRATEGIES.items()
    ]
    return {**STUDY, "sweeps": sweeps}


def run_study(workdir: Path, repeats: int, models: tuple[str, ...]) -> Path:
    """study(models) in a copy of this checkout (results and all): its tables folder."""
    if not workdir.exists():
        subprocess.run(["git", "clone", "--quiet", str(REPO), str(workdir)], check=True)
    config = workdir / "prediction_study.json"
    config.write_text(json.dumps({**study(models), "defaults": {**STUDY["defaults"], "repeats": repeats}}))
    snakemake = [sys.executable, "-m", "snakemake", "--configfile", str(config), "--cores", "2"]
    subprocess.run([*snakemake, "--resources", "gpu=2"], cwd=workdir, check=True)
    return workdir / "results" / "tables"


def calibration(single: pd.DataFrame, multi: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The three calibrating settings: one device at the smallest and largest batch, DDP at the middle."""
    ends = single[single["global_batch"].isin([single["global_batch"].min(), single["global_batch"].max()])]
    ddp = multi[multi["scheme"] == "ddp"]
    batches = sorted(ddp["global_batch"])
    middle = batches[len(batches) // 2]
    return ends, ddp[ddp["global_batch"] == middle].head(1)


def evaluate(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """A row per forecast setting: kind, workload, mode, devices, global_batch, measured with its
    interval, forecast with its interval, and the baselines' throughputs."""
    settings, cells, fits = tables["settings"], tables["cells"], tables["comm_fit"]
    single, multi = calibration_inputs(settings, cells, tables.get("memory_split"))
    before = tables.get("scaling_settings", pd.DataFrame())
    rows = []
    for key, own in multi.groupby(list(FORECAST_GROUP), dropna=False, sort=True):
        singles = group_of(single, key)
        if len(singles) < 2 or not (own["scheme"] == "ddp").any():
            continue
        ends, middle = calibration(singles, own)
        model = Calibration(ends, middle, fits)
        sigma = model_sigma(pd.Series(dtype=float), pd.concat([ends["noise_cv"], middle["noise_cv"]]))
        cal = middle.iloc[0]
        # the calibrating DDP setting's speedup over one device at its batch, per device
        efficiency = cal["samples_per_s"] * model.t1(cal["global_batch"]) / cal["global_batch"] / cal["devices"]
        name = "/".join(str(v) for v in key[:2])
        for index, row in singles.iterrows():
            b = row["global_batch"]
            kind = "calibrating" if index in ends.index else "single"
            made = {"predicted_samples_per_s": b / model.t1(b), "distance": 0.0}
            rows.append(forecast_row(kind, name, row, made, sigma))
        for index, row in own.iterrows():
            n, b, scheme = int(row["devices"]), row["global_batch"], row["scheme"]
            made = model.forecast(scheme, row["backend"], row["env_device"], n, int(b))
            kind = "calibrating" if index == middle.index[0] else scheme.replace("fsdp ", "fsdp-")
            out = forecast_row(kind, name, row, made, sigma)
            comm, _ = model.comm(scheme, row["backend"], row["env_device"], n)
            out["linear"] = b / model.t1(b) * n * efficiency
            out["naive"] = b / (model.t1(b / n) + comm)
            out["before"] = predicted_by_scaling(before, row)
            rows.append(out)
    return with_track_record(pd.DataFrame(rows))


def with_track_record(frame: pd.DataFrame) -> pd.DataFrame:
    """`low`/`high` again from each workload's track record elsewhere: sigma the RMS log error of the
    other workloads' forecasts (none of which read this workload's cells), never below its own
    calibrating noise; `noise_low`/`noise_high` keep the noise-only interval. With three calibrating
    settings a workload has no held-out error of its own (the study's leave-one-out has them)."""
    if frame.empty:
        return frame
    frame = frame.assign(noise_low=frame["low"], noise_high=frame["high"])
    forecasts = frame[frame["kind"] != "calibrating"]
    for workload, rows in frame.groupby("workload"):
        others = forecasts[forecasts["workload"] != workload]
        record = model_sigma(others["predicted"] / others["measured"] - 1)
        if np.isnan(record):
            continue
        for index, row in rows.iterrows():
            sigma = np.nanmax([record, row["noise_sigma"]])
            frame.loc[index, ["low", "high"]] = interval(row["predicted"], sigma, row["distance"])
    return frame


def forecast_row(kind: str, workload: str, row: pd.Series, made: dict, sigma: float) -> dict:
    """The setting's forecast (`made`: its predicted throughput and extrapolation distance) with the
    95 % interval of the calibrating settings' noise `sigma`."""
    predicted = made["predicted_samples_per_s"]
    bounds = interval(predicted, sigma, made["distance"])
    return {
        "kind": kind,
        "workload": workload,
        "devices": int(row["devices"]),
        "global_batch": int(row["global_batch"]),
        "measured": row["samples_per_s"],
        "measured_low": row["samples_per_s_low"],
        "measured_high": row["samples_per_s_high"],
        "predicted": predicted,
        "low": bounds[0],
        "high": bounds[1],
        "distance": made["distance"],
        "noise_sigma": sigma,
    }


def predicted_by_scaling(before: pd.DataFrame, row: pd.Series) -> float:
    """The "why not n x" model's throughput for the setting: its predicted speedup x its baseline's."""
    if before.empty or "setting" not in before:
        return np.nan
    match = before[before["setting"] == row["setting"]]
    if match.empty or "predicted_speedup" not in match:
        return np.nan
    return float(match["predicted_speedup"].iloc[0] * row["samples_per_s"] / row["speedup"])


def errors(frame: pd.DataFrame, column: str) -> pd.Series:
    return (frame[column] / frame["measured"] - 1).dropna()


def fastest_right(frame: pd.DataFrame) -> tuple[int, int]:
    """(workload-batches whose fastest strategy by the model is right, how many were compared):
    every setting at the batch, the calibrating ones at the model's own value for them."""
    right = total = 0
    for (_, _), group in frame.groupby(["workload", "global_batch"]):
        if len(group) < 2:
            continue
        total += 1
        picked, best = group.loc[group["predicted"].idxmax()], group.loc[group["measured"].idxmax()]
        right += picked.name == best.name or picked["measured_high"] >= best["measured_low"]
    return right, total


def report(everything: pd.DataFrame, fsdp: int) -> None:
    frame = everything[everything["kind"] != "calibrating"]
    for _, r in frame.sort_values(["workload", "kind", "global_batch"]).iterrows():
        print(
            f"{r['workload']:24s} {r['kind']:12s} n={r['devices']} B={r['global_batch']:4d}: forecast "
            f"{r['predicted']:8.0f} [{r['low']:.0f}-{r['high']:.0f}], measured {r['measured']:8.0f}: "
            f"{(r['predicted'] / r['measured'] - 1) * 100:+6.1f} %"
        )
    model = errors(frame, "predicted").abs()
    inside = ((frame["low"] <= frame["measured"]) & (frame["measured"] <= frame["high"])).mean()
    noise_only = ((frame["noise_low"] <= frame["measured"]) & (frame["measured"] <= frame["noise_high"])).mean()
    print(f"\n{len(frame)} forecasts, {fsdp} of them FSDP settings (no FSDP cell calibrates them)")
    print(
        f"model   : median |error| {model.median() * 100:5.1f} %, p90 {model.quantile(0.9) * 100:5.1f} %, "
        f"coverage {inside * 100:.0f} % (sigma: the other workloads' errors; the calibrating noise alone: "
        f"{noise_only * 100:.0f} %)"
    )
    multi = frame[frame["kind"] != "single"]
    for name in ("linear", "naive", "before"):
        if name in multi and multi[name].notna().any():
            e = errors(multi, name).abs()
            told = f"{name:8s}: median |error| {e.median() * 100:5.1f} %, p90 {e.quantile(0.9) * 100:5.1f} %"
            print(f"{told} over {len(e)} DDP and FSDP settings")
    for kind, part in multi.groupby("kind"):
        e = errors(part, "predicted").abs()
        told = f"model on {kind} alone: median |error| {e.median() * 100:5.1f} %, p90 {e.quantile(0.9) * 100:5.1f} %"
        inside = ((part["low"] <= part["measured"]) & (part["measured"] <= part["high"])).mean()
        print(f"{told}, coverage {inside * 100:.0f} %")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--tables", type=Path, help="a finished study's results/tables")
    source.add_argument("--run", action="store_true", help="run STUDY first")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/prediction-study"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--models", default=",".join(MODELS), help="of the sweeps (vit: about 100 s a cell on one core of this VM)"
    )
    args = parser.parse_args()
    models = tuple(args.models.split(","))
    if not set(models) <= set(MODELS) | {"lenet", "resnet18"}:
        parser.error(f"--models {args.models}: choose from {', '.join([*MODELS, 'lenet', 'resnet18'])}")
    folder = run_study(args.workdir, args.repeats, models) if args.run else args.tables
    tables = tablefiles.read_tables(folder)
    frame = evaluate(tables)
    if frame.empty:
        sys.exit(f"{folder}: no workload with two single-device batches and a DDP setting to calibrate on")
    fsdp = int((tables["settings"]["mode"] == "fsdp").sum())
    report(frame, fsdp)
    right, total = fastest_right(frame)
    print(f"fastest forecast strategy right in {right} of {total} workload-batches (one device, DDP, FSDP)")


if __name__ == "__main__":
    main()
