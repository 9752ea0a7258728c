"""One cell through the engine's own entry point, as a job runs it: `python -m dpstudy.engine`, or
torchrun with `nproc` processes (Gloo on CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from dpstudy.engine.cores import PIN_ENV
from dpstudy.jobs import cell_command
from helpers import REPO

# The environment of a test that checks the pinning of ranks to cores, which the suite turns off
# for every other process (tests/conftest.py pytest_configure)
PINNED = {PIN_ENV: "1"}


def train(spec: dict, out: Path, nproc: int | None = None, env: dict | None = None, timeout=300):
    """The finished process (`.seconds`: its wall time); the record is out/record.json."""
    # as the launcher starts it, with torchrun's log folders beside the cell's
    launcher = [*cell_command.torchrun(Path(f"{out}.torchrun")), "--standalone", f"--nproc-per-node={nproc}"]
    launcher = launcher if nproc else [sys.executable]
    cmd = launcher + ["-m", "dpstudy.engine", "--spec", json.dumps(spec), "--out", str(out), "--cores", "2"]
    started = time.time()
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}, cwd=REPO
    )
    proc.seconds = time.time() - started
    return proc


def start_launch(spec: dict, out: Path, allocator: str = "auto", env: dict | None = None, extra=()):
    """The cell as the workflow's train job runs it, started in the background: dpstudy.jobs.launch
    (which starts python or torchrun, with the study's allocator) on no GPU and 2 cores; the record
    is out/record.json. `extra`: more of the launcher's arguments (--limit-s S). finish() waits."""
    from dpstudy.study.cells import base_id
    from dpstudy.study.spec import complete

    spec = complete(spec)
    cmd = [sys.executable, "-m", "dpstudy.jobs.launch", "--spec", json.dumps(spec), "--cell", base_id(spec)]
    cmd += ["--out", str(out), "--log", str(out / "train.log"), "--gpus", "0", "--cores", "2", "--allocator", allocator]
    proc = subprocess.Popen(
        [*cmd, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )
    proc.out, proc.started = out, time.time()
    return proc


def finish(proc: subprocess.Popen, timeout=300) -> subprocess.CompletedProcess:
    """A started launch run to its end, as launch() returns it (`.started`: when, in epoch seconds,
    `.seconds`: its wall time, `.log`: the job's log); killed if it runs past `timeout`."""
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    done.started, done.seconds = proc.started, time.time() - proc.started
    log = proc.out / "train.log"
    done.log = log.read_text() if log.exists() else ""
    return done


def launch(spec: dict, out: Path, allocator: str = "auto", timeout=300, env: dict | None = None, extra=()):
    """The cell as the workflow's train job runs it (start_launch), run to its end (finish)."""
    return finish(start_launch(spec, out, allocator, env, extra), timeout)
