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
