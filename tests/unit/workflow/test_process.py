"""Snakemake's own process, set up before the study loads (dpstudy.workflow.process)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from dpstudy.workflow import process, wakeups


def test_jobs_import_this_checkout_and_run_this_interpreter(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", "/usr/bin")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.setattr(wakeups, "coalesce", lambda: True)  # Snakemake's scheduler: test_wakeups.py
    process.prepare(str(tmp_path))
    assert os.environ["PATH"] == os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin"])
    assert os.environ["PYTHONPATH"] == os.pathsep.join([str(tmp_path), "/elsewhere"])


def test_collect_hears_whether_the_run_keeps_going(monkeypatch):
    from helpers import REPO

    monkeypatch.delenv(process.KEEP_GOING, raising=False)
    process.tell_keep_going(True)
    assert os.environ[process.KEEP_GOING] == "1"
    process.tell_keep_going(False)
    assert os.environ[process.KEEP_GOING] == "0"
    # the variable scripts/collect.py reads for its --keep-going default
    assert f'os.environ.get("{process.KEEP_GOING}") == "1"' in (REPO / "scripts/collect.py").read_text()
