"""Build dpstudy's C++/CUDA operators into --out and write --out/build.json.

    python scripts/build_ext.py --out results/ext [--cuda-arch "8.0;9.0"] [--cpu-only] [--force]

CUDA kernels go in when torch has CUDA and a toolkit is found; DPSTUDY_EXT_CPU_ONLY=1 or
--cpu-only forces a CPU-only build. Compiler output goes to stderr.
"""
from __future__ import annotations

import argparse
import json

from dpstudy.ext import build


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results/ext", help="output folder (default: results/ext)")
    parser.add_argument("--cuda-arch", help='CUDA architectures, e.g. "8.0;9.0" (default: the visible GPUs, '
                                            'else "8.0;9.0")')
    parser.add_argument("--cpu-only", action="store_true", default=None, help="leave the CUDA kernels out")
    parser.add_argument("--force", action="store_true", help="rebuild even when build.json is up to date")
    args = parser.parse_args()
    info = build(args.out, cuda_arch=args.cuda_arch, cpu_only=args.cpu_only, force=args.force)
    print(json.dumps({key: info[key] for key in ("so", "with_cuda", "cuda_arch", "note", "build_s")}))


if __name__ == "__main__":
    main()
