"""Which train cells share one scheduler job (issue 52): cells packed into groups of about
`minutes_per_job` minutes of estimated work, so that a study of thousands of short cells submits tens
of jobs instead of thousands (sites ask for jobs of 30 minutes or more, and cap the jobs queued).

What packing keeps true:
- the cells of a group have one node count: a multi-node cell never shares an allocation with a
  cell of another shape;
- the repeats of a setting go to different groups while there are groups enough, so that a slow
  node does not hold every repeat of a setting;
- a cell estimated at `minutes_per_job` or more is a job of its own, and so is every cell of a node
  count whose cells would not fill one job between them: a small study is submitted as before;
- groups fill evenly: each cell goes to the least loaded group among those without a repeat of its
  setting, in the order given (the study's, repeats interleaved).

This module only decides; the workflow names each train job's group (dpstudy.workflow) and the
scheduler's profile sizes the group's allocation.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Packable:
    """A train cell as packing sees it: `setting` names the cell's setting (its repeats share it),
    `minutes` its estimated wall time."""

    cell: str
    setting: str
    nodes: int
    minutes: float


def group_name(nodes: int, index: int) -> str:
    return f"pack-{nodes}n-{index}"


def pack(cells: Sequence[Packable], minutes_per_job: float, fill: bool = True) -> dict[str, str | None]:
    """Each cell's group (group_name), None for a cell that is a job of its own (see the docstring).
    fill=False packs the short cells of a node count even where they would not fill one job (a
    limit on the jobs asks for it)."""
    if not minutes_per_job > 0:
        raise ValueError(f"minutes_per_job must be a number of minutes above 0, not {minutes_per_job!r}")
    bad = [c.cell for c in cells if not c.minutes >= 0]
    if bad:
        raise ValueError(f"cells without an estimate of their minutes: {', '.join(bad[:5])}")
    out: dict[str, str | None] = {c.cell: None for c in cells}
    for nodes in sorted({c.nodes for c in cells}):
        short = [c for c in cells if c.nodes == nodes and c.minutes < minutes_per_job]
        total = sum(c.minutes for c in short)
        if not short or (fill and total < minutes_per_job):
            continue  # they would not fill one job between them
        count = max(1, math.ceil(total / minutes_per_job))
        least = [(0.0, g) for g in range(count)]  # a heap of (load, group): the least loaded first
        settings: list[set[str]] = [set() for _ in range(count)]
        for cell in short:
            passed = []  # groups that hold a repeat of the cell's setting, least loaded first
            while least and cell.setting in settings[least[0][1]]:
                passed.append(heapq.heappop(least))
            load, chosen = heapq.heappop(least) if least else passed.pop(0)
            heapq.heappush(least, (load + cell.minutes, chosen))
            for item in passed:
                heapq.heappush(least, item)
            settings[chosen].add(cell.setting)
            out[cell.cell] = group_name(nodes, chosen)
    return out


def groups(packed: dict[str, str | None]) -> dict[str, list[str]]:
    """The groups' cells, in the order packed: {group: [cell, ...]} (cells of their own left out)."""
    out: dict[str, list[str]] = {}
    for cell, group in packed.items():
        if group is not None:
            out.setdefault(group, []).append(cell)
    return out


def within_jobs(
    cells: Sequence[Packable], minutes_per_job: float, max_jobs: int | None
) -> tuple[dict[str, str | None], float]:
    """pack() with minutes_per_job raised (by half each time) until the cells take at most
    `max_jobs` jobs (None: no limit): (the packing, the minutes per job it took). ValueError when
    even one job per node count is too many."""
    shapes = len({c.nodes for c in cells})
    if max_jobs is not None and shapes > max_jobs:
        raise ValueError(
            f"the cells need at least {shapes} jobs (one per node count), more than the {max_jobs} allowed"
        )
    packed, minutes = pack(cells, minutes_per_job), minutes_per_job
    while max_jobs is not None and jobs(packed) > max_jobs:
        minutes *= 1.5
        packed = pack(cells, minutes, fill=False)  # fewer jobs with every step: at last one per node count
    return packed, minutes


def jobs(packed: dict[str, str | None]) -> int:
    """How many scheduler jobs the packing submits: one per group and one per cell of its own."""
    return len(groups(packed)) + sum(group is None for group in packed.values())
