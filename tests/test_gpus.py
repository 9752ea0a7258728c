"""The GPU slot pool: distinct devices for concurrent jobs; a killed holder frees its slots."""
import os
import signal
import subprocess
import sys
import time

import pytest

from dpstudy.jobs.gpus import acquire

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


def test_wrapper_sets_visible_devices_only_with_gpus(tmp_path):
    # No NVIDIA driver here: the command runs unchanged, and a scheduler's choice is kept.
    show = [sys.executable, "-c", "import os; print(os.environ.get('CUDA_VISIBLE_DEVICES', 'unset'))"]
    out = subprocess.run([sys.executable, "-m", "dpstudy.jobs.gpus", "--gpus", "2", "--pool", str(tmp_path), "--", *show],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "unset"
    out = subprocess.run([sys.executable, "-m", "dpstudy.jobs.gpus", "--gpus", "2", "--", *show], capture_output=True,
                         text=True, check=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": "5,7"})
    assert out.stdout.strip() == "5,7"
