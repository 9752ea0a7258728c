"""A cell's trace (record.trace, dpstudy.engine.tracing) as columns of the cells table: the
pace-setting rank's median step as the trace measured it, and where its traces are.

  trace_step_s, trace_data_wait_s, trace_compute_s, trace_exposed_comm_s, trace_idle_s
                 the partition of the traced step (seconds per step; the four add up to the step)
  trace_comm_s   every collective's time in the step, hidden or not; trace_overlap the share hidden
  trace_step_spread_s  the interquartile range of the traced steps' lengths
  trace_files    every rank's kept trace, relative to the results folder, in rank order ("; ")
  trace_reason   why a rank has no figures or no file
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

PARTS = ("step_s", "data_wait_s", "compute_s", "exposed_comm_s", "idle_s", "comm_s", "step_spread_s", "overlap")
TRACE_COLUMNS = (*(f"trace_{p}" for p in PARTS), "trace_files", "trace_reason")


def trace_columns(path: str, rec: dict[str, Any]) -> dict[str, Any]:
    """The trace's columns of a record read from `path` (…/cells/{cell}/record.json): empty without one."""
    trace = rec.get("trace") or {}
    files = [r["file"] for r in trace.get("ranks") or [] if r.get("file")]
    # results/cells/{cell}/trace/rank0.json.gz as cells/{cell}/trace/rank0.json.gz: where the
    # report (results/report/) links it from, one folder up
    folder = Path(path).parent
    relative = [str(Path(folder.parent.name, folder.name, f)) for f in files]
    return {
        **{f"trace_{p}": trace.get(p) for p in PARTS},
        "trace_files": "; ".join(relative) or None,
        "trace_reason": trace.get("reason"),
    }
