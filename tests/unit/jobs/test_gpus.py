"""The GPU slot pool: distinct devices for concurrent jobs; a killed holder frees its slots; and
the one policy of which GPUs a job sees (job_environment), which the launcher follows too."""

import os
import signal
import subprocess
import sys
import time

import pytest

from dpstudy.jobs import gpus
from dpstudy.jobs.gpus import acquire, job_environment

HOLD = """
import sys, time
from pathlib import Path
from dpstudy.jobs.gpus import acquire
with acquire(int(sys.argv[1]), 2, Path(sys.argv[2])) as slots:
    print(",".join(map(str, slots)), flush=True)
    time.sleep(600)
"""


def holder(n: int, pool) -> tuple[subprocess.Popen, list[int]]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(n), str(pool)], stdout=subprocess.PIPE, text=True)
    return proc, [int(s) for s in proc.stdout.readline().strip().split(",")]


def test_concurrent_holders_get_disjoint_devices(tmp_path):
    proc, held = holder(1, tmp_path)
    try:
        with acquire(1, 2, tmp_path, timeout_s=5) as mine:
            assert len(held) == len(mine) == 1 and set(held).isdisjoint(mine)
        with pytest.raises(TimeoutError, match="no 2 free GPU slots"):
            with acquire(2, 2, tmp_path, timeout_s=1, poll_s=0.1):
                pass
    finally:
        proc.kill()
        proc.wait()


def test_a_killed_holder_gives_its_slots_back(tmp_path):
    proc, held = holder(2, tmp_path)
    assert sorted(held) == [0, 1]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    start = time.monotonic()
    with acquire(2, 2, tmp_path, timeout_s=10, poll_s=0.1) as slots:
        assert sorted(slots) == [0, 1]
    assert time.monotonic() - start < 5


def test_asking_for_more_than_the_machine_has_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="3 GPUs requested but the pool has 2"):
        with acquire(3, 2, tmp_path):
            pass


def test_wrapper_follows_the_policy(tmp_path):
    # No NVIDIA driver here: with GPUs reserved the command runs unchanged, and a scheduler's
    # choice is kept; with none reserved it sees none.
    show = [sys.executable, "-c", "import os; print(os.environ.get('CUDA_VISIBLE_DEVICES', 'unset'))"]

    def seen(gpus: int, env: dict) -> str:
        return subprocess.run(
            [sys.executable, "-m", "dpstudy.jobs.gpus", "--gpus", str(gpus), "--pool", str(tmp_path), "--", *show],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        ).stdout

    unset = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    scheduled = {**os.environ, "CUDA_VISIBLE_DEVICES": "5,7"}
    assert (seen(2, unset), seen(2, scheduled), seen(0, scheduled)) == ("unset\n", "5,7\n", "\n")


@pytest.mark.parametrize("scheduler", [None, "0,1"])
def test_a_job_that_reserved_no_gpu_sees_none(tmp_path, monkeypatch, scheduler):
    # Not even a scheduler's: the GPUs it names may be another job's.
    monkeypatch.setattr(gpus, "visible_gpu_count", lambda: 2)
    if scheduler is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", scheduler)
    with job_environment(0, tmp_path) as env:
        assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert not list(tmp_path.iterdir())  # no slot taken


def test_a_job_that_reserved_two_gpus_sees_the_two_slots_it_holds(tmp_path, monkeypatch):
    monkeypatch.setattr(gpus, "visible_gpu_count", lambda: 3)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    said = []
    with job_environment(2, tmp_path, say=said.append) as env:
        assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and said == ["GPU slots [0, 1]"]
        with job_environment(1, tmp_path) as other:  # a concurrent job gets the slot left
            assert other["CUDA_VISIBLE_DEVICES"] == "2"
    # a scheduler's choice stands; more than the machine has: left to the program to report
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    with job_environment(2, tmp_path) as env:
        assert env["CUDA_VISIBLE_DEVICES"] == "5,7"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    with job_environment(4, tmp_path) as env:
        assert "CUDA_VISIBLE_DEVICES" not in env
