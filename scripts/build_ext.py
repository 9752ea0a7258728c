"""Build dpstudy's C++/CUDA operators into --out and write --out/build.json.

    python scripts/build_ext.py --out results/ext [--cuda-arch "8.0;9.0+PTX"] [--require-cuda] [--cpu-only] [--force]

CUDA kernels go in when torch has CUDA and a toolkit is found, for --cuda-arch, else for the
visible GPUs (with --require-cuda and no GPU visible: dpstudy.ext.arch.DEFAULT_CUDA_ARCH);
DPSTUDY_EXT_CPU_ONLY=1 or --cpu-only forces a CPU-only build. --require-cuda (the workflow
passes it when the study runs CUDA cells) makes a build without CUDA kernels an error, with the
reason, instead of a CPU-only library. Compiler output goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys

from dpstudy.ext import build
from dpstudy.ext.arch import DEFAULT_CUDA_ARCH
from dpstudy.ext.builder import CudaUnavailable
from dpstudy.util.errors import ConfigError


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results/ext", help="output folder (default: results/ext)")
    parser.add_argument(
        "--cuda-arch",
        help=f'CUDA architectures, e.g. "{DEFAULT_CUDA_ARCH}" (default: the visible '
        f'GPUs; with --require-cuda and none visible, "{DEFAULT_CUDA_ARCH}")',
    )
    parser.add_argument(
        "--require-cuda", action="store_true", help="fail, with the reason, unless the CUDA kernels can be built"
    )
    parser.add_argument("--cpu-only", action="store_true", default=None, help="leave the CUDA kernels out")
    parser.add_argument("--force", action="store_true", help="rebuild even when build.json is up to date")
    args = parser.parse_args()
    try:
        info = build(
            args.out, cuda_arch=args.cuda_arch, cpu_only=args.cpu_only, force=args.force, require_cuda=args.require_cuda
        )
    except (CudaUnavailable, ConfigError) as error:
        sys.exit(str(error))
    print(json.dumps({key: info[key] for key in ("so", "with_cuda", "cuda_arch", "note", "build_s")}))


if __name__ == "__main__":
    from dpstudy.util.quick_exit import finish

    finish(main())  # the outputs are written: skip the teardown (dpstudy.util.quick_exit)
