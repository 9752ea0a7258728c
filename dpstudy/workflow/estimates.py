"""How long each train cell will take, estimated before the run (issue 52): what packing cells into
scheduler jobs reads (dpstudy.jobs.packing), written where each cell's job finds it
(dpstudy.jobs.plan_file) and kept in its record (env.job.estimated_s), so that the report says how far off it was.

From what the study already knows, the first that applies:
- "setting": a record of the same setting (another repeat, an earlier run): its total_s;
- "epochs": a record of the setting at another number of epochs: its start-up plus its training
  time scaled to this cell's epochs;
- "guess": nothing measured yet: the study's cluster.cell_minutes;
- "skipped": a cell its launcher records as skipped without starting torch: the launch alone.
Failed and skipped records estimate nothing (a skipped cell took no time; a failed one stopped
early). Reading one record per setting keeps a 10,000-cell plan within seconds.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dpstudy.study import outputs

if TYPE_CHECKING:
    from dpstudy.study.sweeps import Cell

# What a launcher adds to its process's total_s: its own start, Snakemake's job step, the record.
LAUNCH_S = 5.0
SOURCES = ("setting", "epochs", "guess", "skipped")


@dataclass(frozen=True)
class Estimate:
    seconds: float
    source: str  # one of SOURCES

    @property
    def minutes(self) -> float:
        return self.seconds / 60


def setting_key(spec: dict[str, Any], *leave_out: str) -> str:
    """The cell's setting: its spec without its repeat and seed (and `leave_out`)."""
    return json.dumps({k: v for k, v in spec.items() if k not in ("repeat", "seed", *leave_out)}, sort_keys=True)


def measured(cell: Cell) -> tuple[float, float, dict[str, Any]] | None:
    """(total_s, startup_s, spec) of the record at the cell's path, if it trained to the end: an
    earlier run's may have had other settings (its spec says which)."""
    try:
        with open(outputs.record_path(cell.id)) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    summary = record.get("summary") or {}
    total, startup, spec = summary.get("total_s"), summary.get("startup_s"), record.get("spec")
    if record.get("status") != "ok" or not isinstance(spec, dict):
        return None
    if not isinstance(total, (int, float)) or not isinstance(startup, (int, float)):
        return None
    return float(total), float(startup), spec


def estimates(cells: Iterable[Cell], guess_minutes: float, trains: Callable[[str], bool]) -> dict[str, Estimate]:
    """{cell id: Estimate} (see the module's docstring); `trains(cell id)`: whether it starts torch."""
    cells = list(cells)
    skipped = {cell.id for cell in cells if not trains(cell.id)}
    cells = [cell for cell in cells if cell.id not in skipped]
    same: dict[str, float] = {}  # setting -> seconds
    like: dict[str, tuple[float, float, int]] = {}  # setting without epochs -> (total, startup, epochs)
    looked: set[str] = set()
    for cell in cells:
        key = setting_key(cell.spec)
        if key in looked:  # one record per setting: its repeats share it
            continue
        found = measured(cell)
        if found is None:
            continue
        total, startup, spec = found
        if setting_key(spec) == key:
            same[key] = total + LAUNCH_S
            looked.add(key)
        like.setdefault(setting_key(spec, "epochs"), (total, startup, int(spec.get("epochs") or 1)))
    out = {cell: Estimate(LAUNCH_S, "skipped") for cell in skipped}
    for cell in cells:
        key = setting_key(cell.spec)
        other = like.get(setting_key(cell.spec, "epochs"))
        if key in same:
            out[cell.id] = Estimate(same[key], "setting")
        elif other is not None:
            total, startup, epochs = other
            training = max(total - startup, 0.0) * cell.spec["epochs"] / max(epochs, 1)
            out[cell.id] = Estimate(startup + training + LAUNCH_S, "epochs")
        else:
            out[cell.id] = Estimate(60 * guess_minutes, "guess")
    return out


def plan_entries(estimated: dict[str, Estimate], groups: dict[str, str | None] | None) -> dict[str, dict[str, Any]]:
    """What each cell's job reads back (dpstudy.jobs.plan_file): its pack (None: a job of its own, or no packing
    in this run) and its estimate."""
    return {
        cell: {"pack": (groups or {}).get(cell), "estimate_s": round(e.seconds, 1), "source": e.source}
        for cell, e in estimated.items()
    }
