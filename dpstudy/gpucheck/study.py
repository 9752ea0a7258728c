"""Item 2 of `make gpu-check`: the default study with `device: cuda`, end to end to the HTML report.

It runs through real Snakemake from this interpreter, in the repository's own results/ tree, with
every core and `--resources gpu=<visible GPUs>`, as `make run` would on this host. Snakemake then
leaves out the cells that need more GPUs than that, with one warning naming them (dpstudy.study.sweeps
.within_gpu_budget); a cell that does run on too few GPUs records itself as skipped with the
reason. Either way counts as "skipped with the reason"; what is checked afterwards comes from
results/tables (dpstudy.analysis.tables' columns):

- every single g1, dp g1, ddp g1 nccl and ddp g1 gloo cell is `ok`, on CUDA;
- every cell needing more GPUs than visible is skipped (record) or left out (warning), naming GPUs;
- every ok cell has NVML utilisation samples in util.csv;
- results/report/report.html exists.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from dpstudy.util.atomic import atomic_output

# make gpu-check runs in the repository: its tests, its workflow and its results are checked.
REPO = Path.cwd()
TABLES = REPO / "results" / "tables"
REPORT = REPO / "results" / "report" / "report.html"
CORE = (("single", "none"), ("dp", "none"), ("ddp", "nccl"), ("ddp", "gloo"))
LEFT_OUT = re.compile(r"(\d+) cells need more GPUs than --resources gpu allows and are left out: (.+)")


def rules_env() -> dict[str, str]:
    """The environment Snakemake runs in: the rules run `python ...`, and the interpreter running
    gpu-check must be the one they find first; unbuffered, so the log follows the jobs."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, "PATH": path, "PYTHONUNBUFFERED": "1"}


# not copied into a study's own checkout (run_in_copy): outputs, environments, carried wheels
LEFT_BEHIND = ("results", ".snakemake", ".venv", ".whl", ".git", "__pycache__")


def run_in_copy(out: Path, name: str, study: dict, tables: tuple[str, ...], gpus: int) -> dict:
    """`study` through Snakemake in out/<name>, a fresh copy of the checkout (the default study's
    results left alone), up to its `tables`; each one made copied to out/raw/<name>_<table>.csv.
    {"tables": {table: DataFrame} of those made, "files", "wall_s", "command", "returncode"}."""
    import pandas as pd

    workdir = out / name
    if workdir.exists():
        shutil.rmtree(workdir)
    shutil.copytree(REPO, workdir, ignore=shutil.ignore_patterns(*LEFT_BEHIND), symlinks=True)
    (workdir / "study.json").write_text(json.dumps(study))
    targets = [f"results/tables/{table}.csv" for table in tables]
    cores = len(os.sched_getaffinity(0))
    command = [sys.executable, "-m", "snakemake", *targets, "--configfile", "study.json", "--cores", str(cores)]
    command += ["--resources", f"gpu={gpus}"]  # the targets first: --resources takes every word after it
    print("[gpu-check] " + " ".join(command), flush=True)
    started = time.time()
    proc = subprocess.run(command, cwd=workdir, env=rules_env())
    wall = time.time() - started
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    made, files = {}, []
    for table, target in zip(tables, targets, strict=True):
        if (workdir / target).exists():
            made[table] = pd.read_csv(workdir / target)
            shutil.copyfile(workdir / target, raw / f"{name}_{table}.csv")
            files.append(f"raw/{name}_{table}.csv")
    return {"tables": made, "files": files, "wall_s": wall, "command": command, "returncode": proc.returncode}


def snakemake_command(visible: int, cores: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "snakemake",
        "--cores",
        str(cores),
        "--resources",
        f"gpu={visible}",
        "--config",
        "device=cuda",
    ]


def too_big_cells(visible: int, config_path: Path = REPO / "config" / "config.yaml") -> dict[str, int]:
    """{cell id: GPUs it needs} of the default study's cells that need more than `visible` GPUs."""
    from dpstudy.study import sweeps
    from dpstudy.util import yamlfile

    config = yamlfile.safe_load(config_path.read_text())
    config["device"] = "cuda"
    cells = sweeps.expand(sweeps.load(config))
    return {cell.id: cell.gpus for cell in cells if cell.gpus > visible}


def left_out_cells(log_lines: list[str]) -> list[str]:
    """The cells Snakemake's warning says it left out for want of GPUs."""
    cells: list[str] = []
    for line in log_lines:
        match = LEFT_OUT.search(line)
        if match:
            cells += [c.strip() for c in match.group(2).split(",") if c.strip()]
    return cells


def _count_by(kinds) -> str:
    return ", ".join(f"{mode}{'' if backend == 'none' else ' ' + backend} {n}" for (mode, backend), n in kinds)


def check_tables(cells, util, visible: int, too_big: dict[str, int], left_out: list[str]) -> dict:
    """Figures and details of the study from cells.csv and util.csv (DataFrames). Pure."""
    figures, details, notes = {}, {}, []
    cells = cells.copy()
    cells["backend"] = cells["backend"].fillna("none")
    one_node = cells["nodes"].fillna(1) == 1 if "nodes" in cells else True

    # the four kinds of one-GPU cell
    core = cells[one_node & (cells["gpus"] == 1)]
    core = core[[(m, b) in CORE for m, b in zip(core["mode"], core["backend"])]]
    good = (core["status"] == "ok") & (core["env_device"] == "cuda")
    counts = [((m, b), int(((core["mode"] == m) & (core["backend"] == b)).sum())) for m, b in CORE]
    missing = [f"{m} {b}" if b != "none" else m for (m, b), n in counts if n == 0]
    figures["core_cells_ok"] = bool(good.all()) and not missing
    details["core_cells_ok"] = f"{int(good.sum())} of {len(core)} ok on cuda ({_count_by(counts)})"
    if missing:
        details["core_cells_ok"] += f"; no cell of {', '.join(missing)}"
    for row in core[~good].head(8).itertuples():
        notes.append(f"not ok: {row.cell}: {row.status} on {row.env_device}: {row.reason}")

    # cells needing more GPUs than visible
    recorded = cells.set_index("cell")
    accounted, reasons, wrong = 0, set(), []
    for cell in too_big:
        if cell in recorded.index:
            status, reason = recorded.at[cell, "status"], str(recorded.at[cell, "reason"])
            if status == "skipped" and "GPU" in reason:
                accounted += 1
                reasons.add(f"recorded as skipped: {reason!r}")
            else:
                wrong.append(f"{cell}: {status}: {reason}")
        elif cell in left_out:
            accounted += 1
            reasons.add(
                "left out by Snakemake with its warning "
                "('... cells need more GPUs than --resources gpu allows and are left out: ...')"
            )
        else:
            wrong.append(f"{cell}: neither recorded nor left out by Snakemake")
    figures["too_big_skipped"] = accounted == len(too_big)
    if too_big:
        needs = ", ".join(str(g) for g in sorted(set(too_big.values())))
        details["too_big_skipped"] = (
            f"{accounted} of {len(too_big)} cells needing {needs} GPUs ({visible} visible): "
            + "; ".join(sorted(reasons))
        )
    else:
        details["too_big_skipped"] = f"none: every cell fits the {visible} visible GPU{'s' * (visible != 1)}"
    notes += [f"too-big cell not skipped: {w}" for w in wrong[:8]]

    # NVML utilisation of the ok cells on CUDA
    ok = cells[(cells["status"] == "ok") & (cells["env_device"] == "cuda")]["cell"]
    sampled = util[util["gpu_util"].notna()] if len(util) else util
    per_cell = sampled.groupby("cell").size() if len(sampled) else {}
    with_samples = [c for c in ok if c in per_cell]
    figures["util_filled"] = len(ok) > 0 and len(with_samples) == len(ok)
    detail = f"{len(with_samples)} of {len(ok)} ok cells have NVML samples"
    if len(sampled):
        detail += f" ({len(sampled):,} samples, median GPU utilisation {float(sampled['gpu_util'].median()):.0f} %)"
    details["util_filled"] = detail
    lacking = [c for c in ok if c not in per_cell]
    if lacking:
        notes.append(f"ok cells without NVML samples: {', '.join(lacking[:8])}{' ...' if len(lacking) > 8 else ''}")
    return {"figures": figures, "details": details, "notes": notes}


def noise_figures(summary, floor) -> dict:
    """The machine's floor on CUDA and the single-device cells' noise beside it, from summary.csv's
    row and floor.csv (DataFrames; missing tables: None). Pure."""
    figures, details = {"floor_cv": None, "single_cv": None}, {}
    if summary is None or floor is None:
        details["floor_cv"] = "no summary.csv or floor.csv: see the collect rule's log"
        return {"figures": figures, "details": details}
    import pandas as pd

    row = summary.iloc[0]
    on = ", ".join(sorted(set(floor["device"].astype(str)))) or "nothing"
    if not pd.isna(row["floor_cv"]):
        figures["floor_cv"] = float(row["floor_cv"])
    dispatch = row.get("floor_dispatch_cv")
    details["floor_cv"] = (
        f"{int(row['floor_runs'])} runs on {on}: matmuls {row['floor_compute_cv']:.2%}, copies "
        f"{row['floor_memory_cv']:.2%}{'' if pd.isna(dispatch) else f', dispatch {dispatch:.2%}'}; "
        f"verdict on the cells: {row['floor_verdict']}"
    )
    if not pd.isna(row["noise_floor_max_cv"]):
        figures["single_cv"] = float(row["noise_floor_max_cv"])
    details["single_cv"] = (
        f"largest of {int(row['noise_floor_settings'])} single-device settings "
        f"(median {row['noise_floor_median_cv']:.2%})"
    )
    return {"figures": figures, "details": details}


def _copy(src: Path, dst: Path) -> bool:
    if not src.exists():
        return False
    with atomic_output(dst) as tmp:
        shutil.copyfile(src, tmp)
    return True


def run_study(out: Path) -> dict:
    import pandas as pd
    import torch

    from dpstudy.analysis import tablefiles

    visible = torch.cuda.device_count()
    cores = len(os.sched_getaffinity(0))
    command = snakemake_command(visible, cores)
    env = rules_env()
    print("[gpu-check] " + " ".join(command), flush=True)
    started = time.time()
    lines: list[str] = []
    with subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    ) as proc:
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            lines.append(line)
    wall = time.time() - started
    too_big = too_big_cells(visible)
    cells_csv, util_csv = TABLES / "cells.csv", TABLES / "util.csv"
    if not cells_csv.exists():
        raise RuntimeError(
            f"Snakemake ended (exit status {proc.returncode}) without {cells_csv.relative_to(REPO)}; see the log above"
        )
    cells = pd.read_csv(cells_csv, dtype=tablefiles.TEXT["cells"])
    util = pd.read_csv(util_csv) if util_csv.exists() else pd.DataFrame(columns=["cell", "device", "t", "gpu_util"])
    left_out = left_out_cells(lines)
    result = check_tables(cells, util, visible, too_big, left_out)
    figures, details, notes = result["figures"], result["details"], result["notes"]
    figures["snakemake_ok"] = proc.returncode == 0
    details["snakemake_ok"] = f"exit status {proc.returncode}"
    html_ok = REPORT.exists() and REPORT.stat().st_size > 0
    figures["report_html"] = html_ok
    if html_ok:
        fresh = REPORT.stat().st_mtime >= started
        details["report_html"] = (
            f"{REPORT.stat().st_size / 2**20:.1f} MiB, {'made by this run' if fresh else 'up to date, not remade'}"
        )
    else:
        details["report_html"] = "missing: see the report rule's log, results/logs/report.log"
    tables = {
        name: pd.read_csv(TABLES / f"{name}.csv") for name in ("summary", "floor") if (TABLES / f"{name}.csv").exists()
    }
    noise = noise_figures(tables.get("summary"), tables.get("floor"))
    figures.update(noise["figures"])
    details.update(noise["details"])
    figures["wall_s"] = wall
    records = list((REPO / "results" / "cells").glob("*/record.json"))
    trained = sum(1 for r in records if r.stat().st_mtime >= started)
    details["wall_s"] = f"{trained} of {len(records)} cell records written by this run"
    files = []
    for name in ("cells.csv", "settings.csv", "util.csv", "summary.csv", "floor.csv"):
        if _copy(TABLES / name, out / "raw" / name):
            files.append(f"raw/{name}")
    return {
        "figures": figures,
        "details": details,
        "notes": notes,
        "files": files,
        "params": {"command": command[1:], "visible_gpus": visible, "cores": cores},
        "data": {"too_big": too_big, "left_out": left_out},
    }
