"""Each cell's plan as the run that starts its job wrote it: its pack and its estimated wall time
(dpstudy.workflow.estimates makes them), read back by the cell's launcher (dpstudy.jobs.launch).
Its own module, so that the launcher imports no planning code: what it imports is training code
(dpstudy.record.provenance), and an edit of the planning must not flag finished cells."""

from __future__ import annotations

import json
from typing import Any

from dpstudy.util.atomic import write_json

PATH = "results/plan/cells.json"  # relative to the workflow's folder, where jobs run


def write(entries: dict[str, dict[str, Any]], path: str = PATH) -> None:
    """`entries` ({cell: plan}) merged into `path`: a run that plans some cells anew keeps what an
    earlier run wrote for the others."""
    try:
        with open(path) as f:
            plan = json.load(f)
    except (OSError, ValueError):
        plan = {}
    plan.update(entries)
    write_json(path, plan)


def read(cell: str, path: str = PATH) -> dict[str, Any]:
    """The cell's plan ({} when there is none)."""
    try:
        with open(path) as f:
            return json.load(f).get(cell) or {}
    except (OSError, ValueError, AttributeError):
        return {}
