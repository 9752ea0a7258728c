"""The microbenchmarks: custom kernels against a Python loop and PyTorch's ops, and the collectives'
bus bandwidth per backend."""

from __future__ import annotations

import pandas as pd

from dpstudy.report.findings.phrases import not_measured
from dpstudy.report.text import comm_table, kernels_table, markdown_table


def kernels(table: pd.DataFrame | None) -> str:
    if table is None or table.empty:
        return not_measured(
            "custom kernels vs a Python loop vs PyTorch's ops (no kernel benchmark results, kernels.csv)"
        )
    compact, skipped = kernels_table(table)
    return (
        markdown_table(compact) + "\n\nMedian time per call; loops run on a part of the input and are scaled "
        "to the whole." + "".join(f"\n- {line}" for line in skipped)
    )


def comm(table: pd.DataFrame | None) -> str:
    if table is None or table.empty:
        return not_measured("the all-reduce bandwidth (no comm benchmark results, comm.csv)")
    compact, skipped = comm_table(table)
    measured = markdown_table(compact) if not compact.empty else not_measured("no backend could run here")
    return (
        measured + "\n\nAll-reduce bus bandwidth as nccl-tests defines it (algorithm bandwidth x 2(n-1)/n), median "
        "over iterations, slowest rank. The figure adds FSDP's collectives, all-gather and reduce-scatter "
        "(bus bandwidth = algorithm bandwidth x (n-1)/n, of the total size)."
        + "".join(f"\n- {line}" for line in skipped)
    )
