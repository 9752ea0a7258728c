"""Measure all_reduce, all_gather and reduce_scatter bandwidth between 2 processes (Gloo on CPU and
CUDA, NCCL on 2 GPUs); dpstudy/microbench/comm.py defines the sizes and bandwidths (nccl-tests').

    python scripts/comm_bench.py --out results/bench/comm.csv [--quick] [--png FIG]

--quick stops at 4 MiB. Combinations this machine cannot run are rows with a `reason`.
"""

from __future__ import annotations

import argparse

from dpstudy.microbench import comm
from dpstudy.util.atomic import write_csv


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="CSV to write")
    parser.add_argument("--quick", action="store_true", help="sizes up to 4 MiB, fewer iterations")
    parser.add_argument("--png", help="also draw the figure here")
    args = parser.parse_args()
    df = comm.run(quick=args.quick)
    write_csv(df, args.out)
    print(df.drop(columns=["dtype", "world_size"]).to_string(index=False))
    if args.png:
        from dpstudy.microbench.figures import comm_figure

        comm_figure(args.out, args.png)


if __name__ == "__main__":
    main()
