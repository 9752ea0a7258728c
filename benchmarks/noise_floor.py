"""Where a CPU cell's run-to-run noise comes from, and what pinning and the steady window buy.

    .venv/bin/python benchmarks/noise_floor.py [--rounds 6] [--batch 64] [--variants pinned,unpinned]

Trains the default study's single-device cell (synthetic/LeNet, 8,000 samples, 3 epochs; the
quickstart's settings) `rounds` times per variant, the variants interleaved round by round so that
a drift of the machine touches each alike, and prints per variant the mean throughput and its
coefficient of variation over the runs, twice: over the steady window (every step after
`warmup_steps`, what dpstudy reports) and over the epochs after the first (what it reported before
issue 14); and the most CPU other processes used meanwhile (`other_load`, dpstudy.engine.monitor.HostLoad),
so that a run measured on a busy machine is seen as such.

Variants: `pinned` (dpstudy's default on CPU: each rank on its own cores), `unpinned`
(DPSTUDY_PIN_CORES=0), `hashseed` (pinned, and PYTHONHASHSEED=0 for the same dict layouts every
run), `noaslr` (pinned, hash seed fixed, address-space randomisation off: `setarch -R`).
Run it on an otherwise idle machine; its own numbers say when it was not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dpstudy.data import store as data  # noqa: E402

VARIANTS = {
    "pinned": ({}, []),
    "unpinned": ({"DPSTUDY_PIN_CORES": "0"}, []),
    "hashseed": ({"PYTHONHASHSEED": "0"}, []),
    "noaslr": ({"PYTHONHASHSEED": "0"}, ["setarch", "-R"]),
}


def spec(data_root: Path, batch: int, repeat: int) -> dict:
    return {
        "dataset": "synthetic",
        "model": "lenet",
        "mode": "single",
        "batch": batch,
        "epochs": 3,
        "optimizer": "adam",
        "lr": 0.003,
        "loader": "device",
        "device": "cpu",
        "repeat": repeat,
        "data_root": str(data_root),
    }


def run(variant: str, cell_spec: dict, out: Path) -> dict:
    env, prefix = VARIANTS[variant]
    cmd = [
        *prefix,
        sys.executable,
        str(REPO / "scripts" / "train.py"),
        "--spec",
        json.dumps(cell_spec),
        "--out",
        str(out),
        "--cell",
        f"noise-{variant}",
        "--cores",
        "1",
    ]
    subprocess.run(
        cmd, check=True, capture_output=True, cwd=REPO, env={**os.environ, "CUDA_VISIBLE_DEVICES": "", **env}
    )
    rec = json.loads((out / "record.json").read_text())
    later = rec["epochs"][1:]
    return {
        "steady": rec["summary"]["samples_per_s"],
        "epochs_after_first": sum(e["samples"] for e in later) / sum(e["wall_s"] for e in later),
        "other_load": max(e.get("other_load", float("nan")) for e in rec["epochs"]),
    }


def cv(values: list[float]) -> str:
    return f"{statistics.stdev(values) / statistics.mean(values):.1%}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--variants", default="pinned,unpinned")
    args = parser.parse_args()
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    with tempfile.TemporaryDirectory(prefix="dpstudy-noise-") as tmp:
        root = Path(tmp)
        data.prepare("synthetic", root / "data", {"train_size": 8000, "test_size": 2000})
        results: dict[str, list[dict]] = {v: [] for v in variants}
        for i in range(args.rounds):
            for v in variants:
                results[v].append(run(v, spec(root / "data", args.batch, i), root / f"{v}-{i}"))
                r = results[v][-1]
                print(
                    f"round {i} {v:>9}: {r['steady']:8.0f} samples/s (epochs >= 2: {r['epochs_after_first']:8.0f}),"
                    f" other processes {r['other_load']:.2f} cores",
                    flush=True,
                )
    print(f"\n{'variant':>9} {'mean':>8} {'CV steady':>10} {'CV epochs>=2':>13} {'max other load':>15}")
    for v, runs in results.items():
        steady, old = [r["steady"] for r in runs], [r["epochs_after_first"] for r in runs]
        print(
            f"{v:>9} {statistics.mean(steady):8.0f} {cv(steady):>10} {cv(old):>13} "
            f"{max(r['other_load'] for r in runs):>15.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
