"""The report at a study's real size: collect, figures and report timed on recorded cells, no training.

    .venv/bin/python benchmarks/report_scale.py [--sizes 300,1000,3000] [--keep DIR]

Per size, builds a study of that many cells from the record factory of the tests (tests/helpers/records.py):
batch x learning rate x mode (single g1, dp g4, ddp/nccl g4) x 3 repeats on CUDA, with throughputs
that scale plausibly with the batch and the mode, a little seeded noise, probes and utilisation
samples (unless --no-util), plus a few cells that ran out of memory, were skipped or failed. Then
runs, as subprocesses and with the command lines of rules/report.smk: scripts/collect.py,
scripts/figures.py and scripts/report.py, and opens report.html in headless Chromium (1280 x 1000)
for the page's height.

Targets on the 2-core development machine (TARGETS; one screen: 1,000 px): at 3,000 cells collect +
figures + report under 60 s and the page under 20 screens; at 10,000 cells (issue 52) under 120 s
and 25 screens. Each size prints the target of the largest size at or below it and whether it was met.
"""

from __future__ import annotations

import argparse
import math
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from helpers.browser import CHROMIUM, FLAGS  # noqa: E402
from helpers.records import make_record, make_util  # noqa: E402

from dpstudy.record import fields as record  # noqa: E402
from dpstudy.record.provenance import code_version  # noqa: E402
from dpstudy.study.sweeps import write_yaml  # noqa: E402

BATCHES = tuple(8 * 2**k for k in range(10))  # 8 .. 4096
MODES = {
    "single": {"gpus": 1, "backend": "none"},
    "dp": {"gpus": 4, "backend": "none"},
    "ddp": {"gpus": 4, "backend": "nccl"},
}
REPEATS = 3
SCREEN_PX = 1000
# cells: (total seconds, screens) at most
TARGETS = {3000: (60.0, 20), 10000: (120.0, 25)}


def verdict(cells: int, total_s: float, screens: float) -> str:
    """The target of the largest size at or below `cells` (the smallest below them all), met or not."""
    size = max((s for s in TARGETS if s <= cells), default=min(TARGETS))
    seconds, most = TARGETS[size]
    met = total_s <= seconds and screens <= most
    return f"target at {size:,} cells: {seconds:.0f} s, {most} screens: {'met' if met else 'NOT met'}"


FAILED_REASON = "rank 2: RuntimeError: NCCL watchdog timeout (at train.py:141)"
SKIPPED_REASON = "dp: batch 8 is smaller than 4 devices x 4 samples"
OOM_REASON = "rank 0: OutOfMemoryError: CUDA out of memory (at train.py:88)"


def learning_rates(count: int) -> list[float]:
    """`count` learning rates spread geometrically from 0.001 to 0.5, three significant digits."""
    if count == 1:
        return [0.05]
    return [float(f"{0.001 * 500 ** (i / (count - 1)):.3g}") for i in range(count)]


def throughput(mode: str, batch: int, rng: random.Random) -> float:
    """samples/s: one GPU saturates with the batch; 4 GPUs gain more the larger the batch, DDP
    more than DP; about 3 % noise."""
    single = 60000 * batch / (batch + 96)
    efficiency = {"single": 1.0, "dp": 0.30 + 0.35 * batch / (batch + 256), "ddp": 0.45 + 0.5 * batch / (batch + 128)}[
        mode
    ]
    return single * MODES[mode]["gpus"] * efficiency * rng.lognormvariate(0, 0.03)


def accuracy(lr: float, batch: int, rng: random.Random) -> float:
    """Final test accuracy: best near lr 0.05 and small batches, a little noise."""
    return min(
        0.99, max(0.1, 0.92 - 0.06 * math.log10(lr / 0.05) ** 2 - 0.01 * math.log2(batch / 8) + rng.gauss(0, 0.004))
    )


def probe(mode: str, batch: int) -> dict | None:
    """The step model's parts of a step (dpstudy.engine.probe) for DP and DDP cells."""
    step = 0.004 + batch / 60000
    if mode == "ddp":
        return {
            "steps": 8,
            "sync_step_s": step * 1.15,
            "nosync_step_s": step,
            "allreduce_s": step * 0.4,
            "grad_bytes": 246_000,
        }
    if mode == "dp":
        return {"steps": 8, "scatter_s": step * 0.1, "replicate_s": step * 0.3, "gather_s": step * 0.05}
    return None


def one_cell(mode: str, batch: int, lr: float, repeat: int, code: dict, rng: random.Random, util: bool) -> dict:
    """A record: ok, or (rarely, seeded) out of memory, skipped or failed with its reason."""
    keys = {
        "mode": mode,
        **MODES[mode],
        "batch": batch,
        "lr": lr,
        "repeat": repeat,
        "device": "cuda",
        "epochs": 3,
        "suffix": f"-lr{lr:g}-r{repeat}",
        "code": code,
    }
    devices = MODES[mode]["gpus"]
    if mode == "dp" and batch == BATCHES[-1]:
        return make_record("oom", samples_per_s=throughput(mode, batch, rng), reason=OOM_REASON, **keys)
    if mode == "dp" and batch < 4 * devices:
        return make_record("skipped", reason=SKIPPED_REASON, **keys)
    if rng.random() < 0.005:
        rec = make_record("skipped", reason=FAILED_REASON, **keys)
        return {**rec, "status": "failed"}
    final = accuracy(lr, batch, rng)
    busy = [rng.uniform(55, 95) for _ in range(devices)]
    return make_record(
        samples_per_s=throughput(mode, batch, rng),
        accs=(final - 0.2, final - 0.05, final),
        wait_frac=rng.uniform(0.01, 0.08),
        util=make_util(devices, busy) if util else None,
        probe=probe(mode, batch),
        peak_mem=[500.0 + batch / 4 + rng.uniform(0, 20) for _ in range(devices)],
        **keys,
    )


def lr_count(cells: int) -> int:
    """Learning rates enough for `cells` cells of the grid."""
    return math.ceil(cells / (len(BATCHES) * len(MODES) * REPEATS))


def study_records(cells: int, util: bool = True, seed: int = 0) -> list[dict]:
    """About `cells` records: the first cells of a batch x lr x mode x repeat grid, lr slowest."""
    rng, code = random.Random(seed), code_version()
    grid = [
        (mode, batch, lr, repeat)
        for lr in learning_rates(lr_count(cells))
        for batch in BATCHES
        for mode in MODES
        for repeat in range(REPEATS)
    ]
    return [one_cell(*key, code, rng, util) for key in grid[:cells]]


def write_study(root: Path, cells: int, util: bool) -> list[str]:
    """results/cells/<cell>/record.json under `root` and the study's YAML; the record paths, relative."""
    paths = []
    for rec in study_records(cells, util):
        path = Path("results/cells") / rec["cell"] / "record.json"
        record.write(root / path, rec)
        paths.append(str(path))
    study = {
        "study": f"scale{cells}",
        "sweeps": [
            {
                "name": "grid",
                "dataset": "synthetic",
                "model": "lenet",
                "grid": {
                    "mode": list(MODES),
                    "batch": list(BATCHES),
                    "lr": learning_rates(lr_count(cells)),
                    "repeats": REPEATS,
                },
            }
        ],
    }
    (root / "results/report").mkdir(parents=True, exist_ok=True)
    (root / "results/bench").mkdir(parents=True, exist_ok=True)
    write_yaml(study, str(root / "results/report/study.yaml"))
    return paths


def timed(command: list[str], root: Path, log: Path) -> float:
    """Seconds `command` ran in `root`; its output goes to `log`, and a failure stops the benchmark."""
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.run(command, cwd=root, stdout=out, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(command[:2])} failed ({proc.returncode}); see {log}:\n{log.read_text()[-3000:]}")
    return seconds


def stages(root: Path, paths: list[str]) -> dict[str, float]:
    """The three report rules of rules/report.smk, run as their shell lines run them."""
    python, scripts = sys.executable, REPO / "scripts"
    logs = root / "results/logs"
    logs.mkdir(parents=True, exist_ok=True)
    return {
        "collect": timed(
            [python, str(scripts / "collect.py"), "--records", *paths, "--out-dir", "results/tables"],
            root,
            logs / "collect.log",
        ),
        "figures": timed(
            [python, str(scripts / "figures.py"), "--tables", "results/tables", "--out", "results/figures"],
            root,
            logs / "figures.log",
        ),
        "report": timed(
            [
                python,
                str(scripts / "report.py"),
                "--notebook",
                str(REPO / "notebooks/report.ipynb"),
                "--out-dir",
                "results/report",
                "--study",
                root.name,
                "--config",
                "results/report/study.yaml",
                "--tables",
                "results/tables",
                "--figures",
                "results/figures",
                "--bench",
                "results/bench",
            ],
            root,
            logs / "report.log",
        ),
    }


def page_height(html: Path) -> int:
    """document.documentElement.scrollHeight of the page in headless Chromium, 1280 x 1000."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": SCREEN_PX})
            page.goto(html.resolve().as_uri(), wait_until="load")
            return int(page.evaluate("() => document.documentElement.scrollHeight"))
        finally:
            browser.close()


def measure(root: Path, cells: int, util: bool) -> dict:
    paths = write_study(root, cells, util)
    times = stages(root, paths)
    html = root / "results/report/report.html"
    height = page_height(html)
    return {
        "cells": len(paths),
        **times,
        "total": sum(times.values()),
        "mb": html.stat().st_size / 1e6,
        "height": height,
        "screens": height / SCREEN_PX,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="300,1000,3000", help="study sizes in cells, comma-separated")
    parser.add_argument("--keep", type=Path, help="build the studies under DIR/<cells> and keep them")
    parser.add_argument(
        "--no-util", action="store_true", help="records without GPU utilisation samples, as from CPU runs"
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    base = args.keep or Path(tempfile.mkdtemp(prefix="report_scale_"))
    print(
        f"{'cells':>6} {'collect s':>10} {'figures s':>10} {'report s':>9} {'total s':>8} {'HTML MB':>8} "
        f"{'height px':>10} {'screens':>8}",
        flush=True,
    )
    try:
        for size in sizes:
            root = base / str(size)
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir(parents=True)
            r = measure(root, size, not args.no_util)
            print(
                f"{r['cells']:>6} {r['collect']:>10.1f} {r['figures']:>10.1f} {r['report']:>9.1f} {r['total']:>8.1f} "
                f"{r['mb']:>8.2f} {r['height']:>10,} {r['screens']:>8.1f}   {verdict(size, r['total'], r['screens'])}",
                flush=True,
            )
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
