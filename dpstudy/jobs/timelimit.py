"""A train job's wall-time limit (the study's `resources.runtime_min`), kept by the launcher itself.

A scheduler stops a job at its limit (SLURM: the launcher's retry then records why); Snakemake's
local executor does not, so a cell whose rank hangs (a blocked data pipeline, a deadlock, a
collective waiting for a dead peer) would hold its cores until Gloo's 30-minute timeout or for
ever. Outside SLURM the launcher waits for its child until the limit, counted from the launcher's
own start, then stops it: SIGTERM (torchrun hands it to its ranks), SIGKILL after GRACE_S, and the
ranks go with torchrun (dpstudy.util.lifeline). The cell's record is `failed` with the limit, the
time it ran, the last progress line its log shows and, from the ranks' heartbeats
(dpstudy.engine.heartbeat), the rank furthest behind, where, and how long it has been silent; the
other cells of the study go on.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from dpstudy.engine import heartbeat

GRACE_S = 10.0  # from SIGTERM to SIGKILL: time for torchrun to stop its ranks
PROGRESS_MARK = "epoch "  # the engine's progress lines: "epoch 1/3 ..."


def duration(seconds: float) -> str:
    """'45 s', '1 min', '1 min 5 s', '2 h 3 min'."""
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{hours} h"] if hours else []
    parts += [f"{minutes} min"] if minutes else []
    parts += [f"{secs} s"] if secs or not parts else []
    return " ".join(parts[:2])


def wait(child: subprocess.Popen, limit_s: float | None, started: float) -> tuple[int, bool]:
    """(exit code, whether the limit stopped it): wait for `child` until `limit_s` after `started`
    (time.time() of the job's start); None waits as long as it runs."""
    if limit_s is None:
        return child.wait(), False
    try:
        return child.wait(timeout=max(0.0, started + limit_s - time.time())), False
    except subprocess.TimeoutExpired:
        return stop(child), True


def stop(child: subprocess.Popen) -> int:
    """SIGTERM, then SIGKILL after GRACE_S; the child's exit code."""
    child.terminate()
    try:
        return child.wait(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        child.kill()
        return child.wait()


def last_progress(log: Path) -> str | None:
    """The last progress line of the job's log (without the rank's prefix), if any."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    found = [line.strip() for line in lines if PROGRESS_MARK in line and "/" in line]
    return found[-1] if found else None


def reason(limit_s: float, ran_s: float, log: Path, out_dir: Path) -> str:
    """The failed record's reason for a cell the limit stopped (its ranks' heartbeats in `out_dir`)."""
    progress = last_progress(log)
    ranks = heartbeat.laggard(heartbeat.read(out_dir))
    return (
        f"stopped at its time limit of {duration(limit_s)} (resources.runtime_min) after {duration(ran_s)}; "
        + (f"last progress: {progress}" if progress else "no epoch finished")
        + (f"; {ranks}" if ranks else "")
        + "; see train.log"
    )
