"""NCCL against Gloo at otherwise equal settings (the comparisons of kind "backend")."""

from __future__ import annotations

import pandas as pd

from dpstudy.analysis.summary import finished
from dpstudy.report.findings.phrases import (
    SETTINGS_CSV,
    Tables,
    batch_phrase,
    by_setting,
    clipped,
    dataset_model,
    extra_keys,
    members,
    not_measured,
    varied,
    why_not_run,
)
from dpstudy.report.text import plural, significant
from dpstudy.study import modes


def backends(tables: Tables, comm: pd.DataFrame | None = None) -> str:
    """NCCL against Gloo at otherwise equal settings: the comparisons of kind "backend"."""
    cells, comparisons, settings = tables["cells"], tables["comparisons"], by_setting(tables)
    ddp_cells = cells[cells["mode"].isin(modes.per_device_modes())]
    keys_named = varied(tables)
    lines = []
    for _, pair in comparisons[comparisons["kind"] == "backend"].iterrows():
        nccl, gloo, row = (settings.loc[pair["setting"]], settings.loc[pair["other"]], settings.loc[members(pair)[0]])
        verdict = {
            1: "NCCL faster beyond noise",
            -1: "Gloo faster beyond noise",
            0: "within noise" if pair["repeats"] > 1 else "one run each: no claim",
        }[int(pair["claim"])]
        lines.append(
            f"- {dataset_model(row)} on {plural(row['devices'], 'device')} at {batch_phrase(row)}"
            f"{extra_keys(row, keys_named)}: NCCL reached {pair['value']:.2f}x the throughput of Gloo "
            f"({significant(nccl['samples_per_s'])} vs {significant(gloo['samples_per_s'])} samples/s): "
            f"{verdict}."
        )
    if lines:
        answer = "\n".join(clipped(lines, SETTINGS_CSV))
    else:
        missing = [b for b in ("nccl", "gloo") if finished(ddp_cells[ddp_cells["backend"] == b]).empty]
        why = "; ".join(why_not_run(ddp_cells[ddp_cells["backend"] == b], b.upper()) for b in missing)
        answer = not_measured(f"NCCL vs Gloo needs both at equal settings: {why or 'no equal settings ran'}")
    if comm is None or comm.empty:
        return answer + "\n\n" + not_measured("the all-reduce bandwidth (no comm benchmark results, comm.csv)")
    return answer + "\n\nThe all-reduce microbenchmark below measures the bandwidth behind the gap."
