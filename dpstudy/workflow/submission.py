"""How a cluster run submits the study's train cells (issue 52): which cells share a job
(dpstudy.jobs.packing, from each cell's estimate, dpstudy.workflow.estimates), within the study's
and the site's limits on jobs, and the Snakemake settings that make a group one job run cell after
cell: profiles/slurm carries them, the train rule's group and resources read this module.

How Snakemake runs a pack: every cell of it names the pack as its group (the train rule's
`group:`), the pack's cells are one group job through `--group-components dpstudy_pack=N` (they
share no file, so each would be a group job of its own), and each asks for one PACK_SLOT of a
resource limited to one per group job (`--resources pack_slot=1`, scope `local`): Snakemake then
lays the cells out one after another, sizes the job for the largest (GPUs, memory) and sums their
runtimes. Inside the job the slurm executor runs the cells one at a time, each a job step (plugin
2.8.0: `--jobs 1`). Without those settings (a local run, profiles/cluster-generic) there are no
packs: a job per cell.
"""

from __future__ import annotations

import getpass
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dpstudy.jobs import packing
from dpstudy.study.sweeps import Cell
from dpstudy.util.proc import output_of
from dpstudy.workflow.estimates import Estimate

PACK_GROUP = "dpstudy_pack"  # the groups' parent id: --group-components dpstudy_pack=N
PACK_SLOT = "pack_slot"  # --resources pack_slot=1 --set-resource-scopes pack_slot=local
PACK_MARGIN_MIN = 1  # each packed cell's runtime beyond its limit: its launch and its stop
PROFILE_SETTINGS = (
    f"group-components: [{PACK_GROUP}=100000]",
    f"resources: [{PACK_SLOT}=1]",
    f"set-resource-scopes: [{PACK_SLOT}=local]",
)


@dataclass(frozen=True)
class Submission:
    groups: dict[str, str | None]  # cell -> its pack, None: a job of its own
    estimates: dict[str, Estimate]
    minutes_per_job: float | None  # as packed (raised where a limit asked for it); None: no packing
    limit: tuple[int, str] | None  # the jobs allowed and who said so

    @property
    def jobs(self) -> int:
        return packing.jobs(self.groups)

    def summary(self) -> str:
        """One line for the run's log: what will be submitted, and why so."""
        packs = packing.groups(self.groups)
        alone = sum(group is None for group in self.groups.values())
        if not packs:
            text = f"{len(self.groups)} train cells, one job each (no pack: see cluster.minutes_per_job)"
            return text + (f"; at most {count(self.limit[0], 'job')} ({self.limit[1]})" if self.limit else "")
        sizes = sorted(len(cells) for cells in packs.values())
        spread = f"{sizes[0]}-{sizes[-1]}" if sizes[0] != sizes[-1] else f"{sizes[0]}"
        text = (
            f"{len(self.groups)} train cells in {count(self.jobs, 'job')}: {count(len(packs), 'pack')} of {spread}"
            f" cells (about {self.minutes_per_job:.0f} min each)"
        )
        text += f" and {count(alone, 'cell')} of their own" if alone else ""
        return text + (f"; at most {count(self.limit[0], 'job')} ({self.limit[1]})" if self.limit else "")


def count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def plan(
    cells: Sequence[Cell], cluster: dict[str, Any], estimated: dict[str, Estimate], site: tuple[int, str] | None
) -> Submission:
    """The study's submission: `cluster` is the study's cluster section, `estimated` each cell's
    estimate, `site` the site's limit on jobs (site_limit)."""
    limits = [(cluster["max_jobs"], "cluster.max_jobs")] if cluster["max_jobs"] else []
    limits += [site] if site else []
    limit = min(limits) if limits else None
    if cluster["minutes_per_job"] is None and (limit is None or len(cells) <= limit[0]):
        return Submission({cell.id: None for cell in cells}, estimated, None, limit)
    packables = [packing.Packable(c.id, packing_setting(c), c.spec["nodes"], estimated[c.id].minutes) for c in cells]
    # without minutes_per_job, packs only as long as the limit on jobs needs: from the work per job allowed
    minutes = cluster["minutes_per_job"] or sum(p.minutes for p in packables) / limit[0]
    packed, used = packing.within_jobs(packables, minutes, limit[0] if limit else None)
    return Submission(packed, estimated, used, limit)


def packing_setting(cell: Cell) -> str:
    """What the repeats of a setting share: the cell id without its repeat."""
    return re.sub(r"-r\d+$", "", cell.id)


def site_limit() -> tuple[int, str] | None:
    """The fewest jobs this user may have queued, and where that was read: the association's
    MaxSubmitJobs (sacctmgr, where there is accounting) or the controller's MaxJobCount (scontrol
    show config); None where SLURM tells neither (not on a SLURM host)."""
    found = []
    assoc = output_of(
        ["sacctmgr", "-nP", "show", "assoc", f"user={getpass.getuser()}", "format=MaxSubmit"], timeout_s=10
    )
    numbers = [int(v) for v in (assoc or "").split() if v.strip().isdigit()]
    if numbers:
        found.append((min(numbers), "MaxSubmitJobs of your SLURM association"))
    config = output_of(["scontrol", "show", "config"], timeout_s=10) or ""
    match = re.search(r"^MaxJobCount\s*=\s*(\d+)", config, re.MULTILINE)
    if match:
        found.append((int(match.group(1)), "the SLURM controller's MaxJobCount"))
    return min(found) if found else None


def missing_profile_settings(
    group_components: dict[str, int], resources: dict[str, Any], local_scopes: set[str]
) -> list[str]:
    """The PROFILE_SETTINGS a packing run lacks (a command line's --resources replaces the
    profile's list, dropping pack_slot)."""
    missing = []
    if resources.get(PACK_SLOT) != 1:
        missing.append(PROFILE_SETTINGS[1])
    if PACK_SLOT not in local_scopes:
        missing.append(PROFILE_SETTINGS[2])
    return missing if group_components.get(PACK_GROUP, 1) > 1 else []
