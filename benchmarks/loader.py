"""Loader benchmark (issue: training engine, section 7): the same lenet/synthetic cell at batch 64
for two epochs, reporting the steady (second) epoch:

  (a) loader torch, 0 workers, augment affine   -- source 002's baseline
  (b) the same with 2 workers
  (c) loader device, augment affine             -- the whole split on the device, augmented in batches
  (d) the bound: the bare training step over pre-made tensors, no augmentation

    .venv/bin/python benchmarks/loader.py [--threads N] [--device cpu|cuda]

Targets on the 2-core CPU: (c) >= 2.5x faster than (a), and (c) within 1.15x of (d).
With a GPU: (c) >= 20x faster than (a), data wait under 5 % of the epoch (`make gpu-check` checks
these). The measuring is dpstudy.microbench.loader's; this script prints its table.
"""

from __future__ import annotations

import argparse

import torch

from dpstudy.microbench import loader


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--device", default="auto")
    parser.add_argument("--repeats", type=int, default=3, help="runs of (c) and (d); the median is reported")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = loader.run(args.device, repeats=args.repeats)
    print(
        f"lenet / synthetic (10000 samples), batch 64, steady epoch, {args.threads} threads, "
        f"device {args.device}; (c) and (d): median of {args.repeats}"
    )
    print("\n".join(loader.table(results)))
    print(
        f"(c) is {results['a']['wall_s'] / results['c']['wall_s']:.2f}x faster than (a) (target >= 2.5x on CPU, "
        f">= 20x on GPU); (c) / (d) = {results['c']['wall_s'] / results['d']['wall_s']:.2f} (target <= 1.15)"
    )


if __name__ == "__main__":
    main()
