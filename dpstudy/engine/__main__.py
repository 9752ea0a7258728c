"""Train one cell and write DIR/record.json.

  python -m dpstudy.engine --spec SPEC --out DIR                                         (single, dp)
  torchrun --standalone --nproc-per-node=G -m dpstudy.engine --spec SPEC --out DIR      (ddp, fsdp)
  srun torchrun --nnodes=N --nproc-per-node=G --rdzv-backend=c10d ... -m dpstudy.engine ...  (ddp, fsdp; N nodes)

The workflow runs it through `python -m dpstudy.jobs.launch`, which picks the right line.

SPEC is a JSON object, inline or a file path (settings: dpstudy/study/schema.yaml, $defs/spec).
"""

import os
import time

T0 = time.time()  # startup_s counts the imports too
PARENT = os.getppid()

import argparse  # noqa: E402
import sys  # noqa: E402

from dpstudy.util.lifeline import die_with_parent  # noqa: E402

# A rank dies with its launcher (torchrun starts ranks in sessions of their own): a killed
# launcher must not leave ranks training on and writing a record later.
die_with_parent(parent=PARENT)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", required=True, help="JSON object or path to a JSON file")
    parser.add_argument("--out", required=True, help="output folder of the cell")
    parser.add_argument("--cell", help="cell id recorded (default: derived from the spec)")
    parser.add_argument(
        "--cores",
        type=int,
        default=len(os.sched_getaffinity(0)),
        help="CPU cores the whole job may use (shared by its processes)",
    )
    args = parser.parse_args()

    from dpstudy.study.cells import base_id
    from dpstudy.study.spec import load_spec
    from dpstudy.util.errors import ConfigError

    try:
        spec = load_spec(args.spec)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from dpstudy.engine.cell import run

    return run(spec, args.out, args.cell or base_id(spec), T0, args.cores)


if __name__ == "__main__":
    from dpstudy.util.quick_exit import exit_now

    exit_now(main())  # the record is written: skip torch's teardown (dpstudy.util.quick_exit)
