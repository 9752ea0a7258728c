"""Measure all_reduce, all_gather and reduce_scatter bandwidth between processes (Gloo on CPU and
CUDA, NCCL on GPUs) at each world size asked for; dpstudy/microbench/comm.py defines the sizes and
bandwidths (nccl-tests').

    python scripts/comm_bench.py --out results/bench/comm.csv [--world-sizes 2 4 8] [--quick] [--png FIG]

--world-sizes defaults to 2 (the workflow passes what the study runs and forecasts, up to what the
host holds: dpstudy.study.resources.comm_world_sizes). --quick stops at 4 MiB. Combinations this
machine cannot run are rows with a `reason`.
"""

from __future__ import annotations

import argparse

from dpstudy.microbench import comm
from dpstudy.util.atomic import write_csv


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="CSV to write")
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2], help="processes per run (default 2)")
    parser.add_argument("--quick", action="store_true", help="sizes up to 4 MiB, fewer iterations")
    parser.add_argument("--png", help="also draw the figure here")
    args = parser.parse_args()
    if min(args.world_sizes) < 2:
        parser.error(f"--world-sizes: every size must be 2 or more, got {args.world_sizes}")
    df = comm.sweep(sorted(set(args.world_sizes)), quick=args.quick)
    write_csv(df, args.out)
    print(df.drop(columns=["dtype"]).to_string(index=False))
    if args.png:
        from dpstudy.microbench.figures import comm_figure

        comm_figure(args.out, args.png)


if __name__ == "__main__":
    from dpstudy.util.quick_exit import finish

    finish(main())  # the outputs are written: skip the teardown (dpstudy.util.quick_exit)
