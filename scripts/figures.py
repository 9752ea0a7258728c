"""Render every figure of dpstudy.report.figures.FIGURES from the tables into a folder of PNGs.

python scripts/figures.py --tables results/tables --out results/figures
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dpstudy.analysis import tablefiles
from dpstudy.report import figures as plots


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", type=Path, required=True, help="folder written by scripts/collect.py")
    parser.add_argument("--out", type=Path, required=True, help="folder of the PNGs")
    args = parser.parse_args(argv)
    for path in plots.render(tablefiles.read_tables(args.tables), args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    from dpstudy.util.quick_exit import finish

    finish(main())  # the outputs are written: skip the teardown (dpstudy.util.quick_exit)
