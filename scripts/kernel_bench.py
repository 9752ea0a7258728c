"""Time the extension's kernels against the sources' Python loops and PyTorch; write a tidy CSV.

python scripts/kernel_bench.py --out results/bench/kernels.csv [--quick] [--ext DIR] [--png FIG]
"""

from __future__ import annotations

import argparse

import pandas as pd

import dpstudy.ext
from dpstudy.microbench import kernels
from dpstudy.util.atomic import write_csv


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="CSV to write")
    parser.add_argument("--quick", action="store_true", help="short timings and smaller loop subsets (smoke test)")
    parser.add_argument("--ext", help="built extension folder (default: $DPSTUDY_EXT_DIR or results/ext)")
    parser.add_argument("--png", help="also draw the figure here")
    args = parser.parse_args()
    df = kernels.run(dpstudy.ext.load(args.ext), quick=args.quick)
    write_csv(df, args.out)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(df.drop(columns=["note"]).to_string(index=False))
    if args.png:
        from dpstudy.microbench.figures import kernels_figure

        kernels_figure(args.out, args.png)


if __name__ == "__main__":
    from dpstudy.util.quick_exit import finish

    finish(main())  # the outputs are written: skip the teardown (dpstudy.util.quick_exit)
