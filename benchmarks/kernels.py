"""Check the kernel targets against a kernels.csv (run the benchmark first, or pass --run).

    python benchmarks/kernels.py [--csv results/bench/kernels.csv] [--run] [--quick]

Targets (CPU, this project's issue): extension rgb_to_grayscale >= 1000x the Python loop and at
least as fast as PyTorch; extension max_pool2d backward >= 100x the Python loop.
"""

from __future__ import annotations

import argparse

import pandas as pd

# (op, column, minimum)
TARGETS = [
    ("rgb_to_grayscale", "speedup_vs_loop", 1000.0),
    ("rgb_to_grayscale", "speedup_vs_pytorch", 1.0),
    ("max_pool2d_backward", "speedup_vs_loop", 100.0),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--csv", default="results/bench/kernels.csv")
    parser.add_argument("--run", action="store_true", help="run the benchmark instead of reading --csv")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.run:
        import dpstudy.ext
        from dpstudy.microbench import kernels

        df = kernels.run(dpstudy.ext.load(), quick=args.quick)
    else:
        df = pd.read_csv(args.csv)
    ext = df[(df.impl == "extension") & (df.device == "cpu")]
    for op, column, minimum in TARGETS:
        for row in ext[ext.op == op].itertuples():
            value = getattr(row, column)
            verdict = "ok" if value >= minimum else "MISSED"
            print(f"{op:20} {row.shape:14} {column:19} {value:10.1f}x  target >= {minimum:g}x  {verdict}")
    # PyTorch's own vectorised function too, not only the integer reference.
    cpu = df[(df.op == "rgb_to_grayscale") & (df.device == "cpu")].set_index("impl")["median_s"]
    if "torchvision" in cpu:
        ratio = cpu["torchvision"] / cpu["extension"]
        print(
            f"{'rgb_to_grayscale':20} {'vs torchvision':34} {ratio:10.1f}x  target >= 1x  "
            f"{'ok' if ratio >= 1 else 'MISSED'}"
        )


if __name__ == "__main__":
    main()
