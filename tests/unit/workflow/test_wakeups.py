"""Snakemake's scheduler woken once per pending wake-up (dpstudy.workflow.wakeups), not once more per
finished job: the timers in process, and a real Snakemake run with and without."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest
from helpers import REPO

from dpstudy.workflow import wakeups


def scheduler():
    return SimpleNamespace(_open_jobs=threading.Semaphore(0))


def releases(s, within: float) -> int:
    """How many times the scheduler was woken within `within` seconds from now."""
    count, deadline = 0, time.monotonic() + within
    while s._open_jobs.acquire(timeout=max(0.0, deadline - time.monotonic())):
        count += 1
    return count


def test_requests_while_one_is_pending_wake_the_scheduler_once():
    s = scheduler()
    for _ in range(5):
        wakeups.schedule_once(s, 0.1)
    assert getattr(s, wakeups.PENDING)[1].daemon  # Snakemake does not wait for it at exit
    assert releases(s, 0.6) == 1
    wakeups.schedule_once(s, 0.05)  # the pending one has fired: a new one
    assert releases(s, 0.5) == 1


def test_a_request_due_sooner_than_the_pending_one_gets_its_own():
    s = scheduler()
    wakeups.schedule_once(s, 0.6)
    wakeups.schedule_once(s, 0.05)
    assert releases(s, 0.4) == 1  # the sooner one
    assert releases(s, 0.6) == 1  # and the first, at its time


def test_the_installed_snakemake_is_the_one_the_patch_was_written_for():
    # A new Snakemake leaves its scheduler unpatched (below): read the new
    # JobScheduler._schedule_reevalutation, measure the default study's rounds again, then move on.
    installed = wakeups.installed_version()
    assert installed == wakeups.WRITTEN_FOR, (
        f"snakemake {installed} is installed, dpstudy.workflow.wakeups was written for {wakeups.WRITTEN_FOR}: "
        "re-read JobScheduler._schedule_reevalutation, re-measure the scheduler's wake-ups (the module's "
        "docstring) and update WRITTEN_FOR"
    )


def test_coalesce_replaces_snakemakes_method():
    from snakemake.scheduling.job_scheduler import JobScheduler

    original = JobScheduler._schedule_reevalutation
    warnings = []
    try:
        assert wakeups.coalesce(warn=warnings.append) and JobScheduler._schedule_reevalutation is wakeups.schedule_once
    finally:
        JobScheduler._schedule_reevalutation = original
    assert warnings == []


def test_on_another_snakemake_coalesce_changes_nothing_and_says_so_once(monkeypatch):
    from snakemake.scheduling.job_scheduler import JobScheduler

    monkeypatch.setattr(wakeups, "installed_version", lambda: "99.0.0")
    original = JobScheduler.__dict__["_schedule_reevalutation"]
    warnings = []
    assert wakeups.coalesce(warn=warnings.append) is False
    assert JobScheduler.__dict__["_schedule_reevalutation"] is original
    assert len(warnings) == 1 and "Snakemake 99.0.0" in warnings[0] and f"is not {wakeups.WRITTEN_FOR}" in warnings[0]


SNAKEFILE = """
import atexit, sys
sys.path.insert(0, {repo!r})
from snakemake.scheduling.job_scheduler import JobScheduler
from dpstudy.workflow import wakeups
{patch}
# every scheduling round finishes the jobs done since the last one: count the rounds
finish, rounds = JobScheduler._finish_jobs, []
def counted(self):
    rounds.append(1)
    return finish(self)
JobScheduler._finish_jobs = counted
atexit.register(lambda: open("rounds.txt", "w").write(str(len(rounds))))
rule all:
    input: expand("out/{{i}}.txt", i=range(6))
rule job:
    output: "out/{{i}}.txt"
    shell: "sleep 0.4; touch {{output}}"
"""
TIMESPAN_S = 0.1  # the rate limiter's (Snakemake's default is 1 s): its wake-ups ten times as often


@pytest.mark.slow
def test_a_real_run_ends_and_is_woken_once_per_timespan_at_most(tmp_path):
    # Unpatched, every round starts one more 100 ms wake-up chain: this run had not ended 30 s
    # and 40 s after its last job (two tries); patched: 8 rounds, ended in 5 s.
    (tmp_path / "Snakefile").write_text(SNAKEFILE.format(repo=str(REPO), patch="assert wakeups.coalesce()"))
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "1", "--max-jobs-per-timespan", "100/100ms"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    seconds = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(list((tmp_path / "out").iterdir())) == 6
    rounds = int((tmp_path / "rounds.txt").read_text())
    # one round per finished job (and the first), one per pending wake-up at most
    assert 6 < rounds <= seconds / TIMESPAN_S + 6 + 2, (rounds, seconds)
