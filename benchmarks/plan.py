"""Time the dry run (`snakemake -n`) of a generated 1,000-cell study.

    .venv/bin/python benchmarks/plan.py [--cells-per-sweep 250] [--sweeps 4]

Target on the 2-core development machine: at most 10 s for 1,000 cells. Prints the measured
seconds, the number of train jobs Snakemake planned and the ratio to the target.
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
TARGET_S = 10.0
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
    args = parser.parse_args()
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(study(args.sweeps, args.lrs), f)
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    cmd = [
        str(bin_dir / "snakemake"),
        "-n",
        "--cores",
        "1",
        "--resources",
        "gpu=8",
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
    print(f"dry run of {cells} cells: {seconds:.2f} s (target {TARGET_S:.0f} s, ratio {seconds / TARGET_S:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
