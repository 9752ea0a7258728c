"""Predict every cell's peak memory per device before any training, on this host, without the
cells' hardware (dpstudy.workflow.memory_plan), into the memory plan CSV.

    python scripts/memory_plan.py --study results/report/study.yaml --out results/plan/memory.csv [--budget-gib G]
"""

from __future__ import annotations

import argparse
import sys

from dpstudy.data import store
from dpstudy.study import sweeps
from dpstudy.util import yamlfile
from dpstudy.util.errors import ConfigError
from dpstudy.workflow import memory_plan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--study", required=True, help="the study as it runs (rule study_config's YAML)")
    parser.add_argument("--out", required=True, help="the plan CSV to write")
    parser.add_argument("--budget-gib", type=float, help="study memory_budget_gib: skip cells predicted above it")
    args = parser.parse_args(argv)
    with open(args.study) as f:
        try:
            study = sweeps.load(yamlfile.safe_load(f))
            cells = sweeps.expand(study)
        except ConfigError as error:
            sys.exit(f"error: {args.study}: {error}")
    specs = {cell.id: cell.spec for cell in cells}
    # the samples a `device` loader will keep resident, known before any dataset is prepared where
    # it is generated (a download's are known once it is)
    sizes = {
        spec["dataset"]: store.split_sizes(spec["dataset"], spec["data_root"], study["datasets"].get(spec["dataset"]))
        for spec in specs.values()
    }
    rows = memory_plan.plan_rows(specs, args.budget_gib, log=lambda line: print(line, flush=True), sizes=sizes)
    memory_plan.write_plan(rows, args.out)
    skipped = {row["cell"] for row in rows if row["skip"]}
    print(f"wrote {args.out}: {len(cells)} cells, {len(skipped)} predicted not to fit and not to be launched")
    return 0


if __name__ == "__main__":
    from dpstudy.util.quick_exit import finish

    finish(main())  # the outputs are written: skip the teardown (dpstudy.util.quick_exit)
