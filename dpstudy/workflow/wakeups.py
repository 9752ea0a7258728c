"""One pending wake-up of Snakemake's scheduler at a time, instead of one more for every job.

Snakemake's job rate limiter (`--max-jobs-per-timespan`, default 100/1s, always on outside a dry
run) ends every scheduling round by starting a timer that wakes the scheduler one timespan later,
and each wake-up is a round that starts another: every job that finishes adds a wake-up chain that
never ends (snakemake 9.27.1, JobScheduler._schedule_reevalutation; upstream discussion in
snakemake/snakemake#3744). By the end of a study the scheduler woke many times a second, each
round starting a thread and checking every ready job's inputs: CPU of Snakemake's own process,
spent while the timed cells ran (the README quotes what the fix bought, with the date and machine).

`coalesce()` replaces the method by one that keeps at most one timer pending (a later request
that is due sooner still gets its own): the rate limit still wakes the scheduler once per
timespan while it holds jobs back, and a finished job still wakes it at once. The timer is a
daemon thread, so that Snakemake no longer waits for it at exit.

The method is private: the patch is made only on the Snakemake it was written for and measured
with (WRITTEN_FOR, the version the lock pins). On another version coalesce() changes nothing and
says so once; tests/unit/workflow/test_wakeups.py fails until the method has been re-read and
the patch re-measured on the new version.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

PENDING = "_dpstudy_pending_wakeup"  # (due, timer) on the scheduler
WRITTEN_FOR = "9.27.1"  # the Snakemake whose JobScheduler._schedule_reevalutation this replaces


def schedule_once(scheduler, delay: float) -> None:
    """Wake `scheduler` in `delay` seconds unless a pending wake-up comes no later. A timer that
    has fired is not pending (its due time has passed: it starts later than `due` is read), so the
    round it wakes starts the next one and the rate limiter keeps its one wake-up per timespan."""
    now = time.monotonic()
    due = now + delay
    pending = getattr(scheduler, PENDING, None)
    if pending is not None and now < pending[0] <= due:
        return
    timer = threading.Timer(delay, scheduler._open_jobs.release)
    timer.daemon = True
    setattr(scheduler, PENDING, (due, timer))
    timer.start()


def installed_version() -> str | None:
    """The installed Snakemake's version, or None without Snakemake."""
    try:
        import snakemake
    except ImportError:
        return None
    return snakemake.__version__


def coalesce(warn: Callable[[str], None] | None = None) -> bool:
    """Install schedule_once on Snakemake's JobScheduler; False (nothing changed) where this
    Snakemake is not the one the patch was written for (one warning, through `warn`: Snakemake's
    logger unless given) or has no such method."""
    version = installed_version()
    if version is None:
        return False
    if version != WRITTEN_FOR:
        if warn is None:
            from snakemake.logging import logger

            warn = logger.warning
        warn(
            f"dpstudy: Snakemake {version} is not {WRITTEN_FOR}, which dpstudy.workflow.wakeups was "
            "written for: its scheduler is left as it is (it may wake many times a second while cells run)"
        )
        return False
    try:
        from snakemake.scheduling.job_scheduler import JobScheduler
    except ImportError:
        return False
    if not callable(getattr(JobScheduler, "_schedule_reevalutation", None)):
        return False
    JobScheduler._schedule_reevalutation = schedule_once
    return True
