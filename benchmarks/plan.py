"""Time the dry run (`snakemake -n`) of a generated study: 1,000 cells by default.

    .venv/bin/python benchmarks/plan.py [--sweeps 4] [--lrs 10]
    .venv/bin/python benchmarks/plan.py --sweeps 5 --lrs 80      # 10,000 cells
    .venv/bin/python benchmarks/plan.py --sweeps 5 --lrs 80 --profile profiles/slurm   # and packed

Each sweep trains one of MODELS (sweeps beyond five repeat a model's cells, which the study
deduplicates) over 25 cells per learning rate. Targets on the 2-core development machine
(TARGETS): at most 10 s for 1,000 cells, 30 s for 10,000 (issue 52). Prints the measured seconds,
the number of train jobs Snakemake planned and the ratio to the target of the largest size at or
below it.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
TARGETS = {1000: 10.0, 10000: 30.0}  # cells: seconds at most
MODELS = ("lenet", "vgg_bn", "resnet18", "simplecnn", "vgg19")


def study(sweeps: int, lrs: int) -> dict:
    # Per sweep: single (5 batches) + ddp (4 gpu counts x 5 batches), times `lrs` learning rates.
    grid = {
        "mode": ["single", "ddp"],
        "gpus": [1, 2, 4, 8],
        "batch": [16, 32, 64, 128, 256],
        "backend": ["gloo"],
        "lr": [round(0.01 * (i + 1), 3) for i in range(lrs)],
    }
    return {
        "study": "plan_benchmark",
        "sweeps": [
            {"name": f"s{i}", "dataset": "synthetic", "model": MODELS[i % len(MODELS)], "grid": grid}
            for i in range(sweeps)
        ],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweeps", type=int, default=4)
    parser.add_argument("--lrs", type=int, default=10, help="learning rates per sweep (25 cells each)")
    parser.add_argument("--profile", help="plan as this profile's run would (profiles/slurm: the packing too)")
    args = parser.parse_args()
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(study(args.sweeps, args.lrs), f)
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    run = ["--profile", args.profile] if args.profile else ["--cores", "1", "--resources", "gpu=8"]
    cmd = [
        str(bin_dir / "snakemake"),
        "-n",
        *run,
        "--configfile",
        f.name,
        "--quiet",
        "rules",
    ]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    os.unlink(f.name)
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
        return 1
    planned = re.search(r"^train\s+(\d+)", proc.stdout + proc.stderr, re.M)
    cells = int(planned.group(1)) if planned else -1
    size = max((s for s in TARGETS if s <= cells), default=min(TARGETS))
    target = TARGETS[size]
    ratio = seconds / target
    how = f" with --profile {args.profile}" if args.profile else ""
    target_text = f"target at {size:,} cells {target:.0f} s, ratio {ratio:.2f}"
    print(f"dry run of {cells} cells{how}: {seconds:.2f} s ({target_text})")
    for line in (proc.stdout + proc.stderr).splitlines():
        if line.startswith("dpstudy: "):  # what a packing run would submit
            print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
