"""Snakemake's own process, set up once before the study loads (rules/common.smk): what its jobs
import and run, and how often its scheduler wakes."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from dpstudy.record.provenance import export_checkout
from dpstudy.workflow import wakeups


def prepare(basedir: str) -> None:
    """Jobs import dpstudy from the workflow's checkout `basedir` and run this interpreter's
    `python`; the scheduler keeps one pending wake-up at a time (dpstudy.workflow.wakeups)."""
    export_checkout(basedir)
    wakeups.coalesce()
    os.environ["PATH"] = python_first(os.environ.get("PATH", ""))


# Whether the run keeps going past a failed job (--keep-going): scripts/collect.py reads it.
KEEP_GOING = "DPSTUDY_KEEP_GOING"


def tell_keep_going(keep_going: bool) -> None:
    """Tell the jobs this process starts whether the run keeps going past a failed job: collect then
    lists an unreadable record and collects the rest. An environment variable, not a param, so that
    flipping the flag reruns nothing."""
    os.environ[KEEP_GOING] = "1" if keep_going else "0"


def python_first(path: str) -> str:
    """`path` with the folder of the interpreter Snakemake runs on (the venv's) first: also when
    it was started as .venv/bin/snakemake without the venv on PATH, a job's `python` is this one
    (another Python failed with "No module named 'torch'"). A job's own conda environment, when
    used, still comes first: Snakemake puts it before this."""
    return os.pathsep.join([str(Path(sys.executable).parent), path])
