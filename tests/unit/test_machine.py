"""The suite's own gauge of the machine (tests/helpers/machine.py): what the cores did over a run."""

import re
import time

import pytest
from helpers import machine


def test_usage_splits_the_cores_ticks_into_busy_idle_and_stolen():
    start = dict.fromkeys(machine.STAT_FIELDS, 1000)
    end = {**start, "user": 1700, "system": 1100, "softirq": 1010, "idle": 1150, "iowait": 1010, "steal": 1030}
    # 1000 ticks in all: 810 busy (user 700, system 100, softirq 10), 160 idle (iowait 10), 30 stolen
    line = machine.usage(start, end, cores=2, ticks_per_s=100)
    assert line == (
        "2 cores: busy 81.0 % (8 CPU-s by all its processes, the suite's and any other), idle 16.0 %, "
        "taken by the hypervisor 3.0 %"
    )


def test_the_ticks_of_this_machine_grow_with_a_busy_core():
    before = machine.cpu_ticks()
    assert set(before) == set(machine.STAT_FIELDS)
    deadline = time.process_time() + 0.3  # spin: 0.3 s of this process's CPU
    while time.process_time() < deadline:
        pass
    after = machine.cpu_ticks()
    busy = sum(after[f] - before[f] for f in machine.BUSY_FIELDS)
    assert busy >= 0.25 * machine.TICKS_PER_S  # at least what the spin took, less a tick's rounding
    assert all(after[f] >= before[f] for f in machine.STAT_FIELDS)


def test_a_new_processs_cpu_is_read_from_its_own_rusage():
    # the child spins 0.3 s of its own CPU; the parent sleeps meanwhile and is not counted
    spin = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass"
    assert 0.28 <= machine.child_cpu_s(spin) < 5
    assert machine.child_cpu_s("pass") < 0.28
    with pytest.raises(RuntimeError, match=r"raise SystemExit\(3\).* exited with 3"):
        machine.child_cpu_s("raise SystemExit(3)")


def test_the_reference_line_gives_every_gauge_a_number():
    line = machine.reference(rounds=1)
    number = r"[0-9]+\.[0-9]"
    assert re.fullmatch(
        rf"{number} M Python steps/s, {number} GB/s copied, {number} GB/s into fresh pages,"
        rf" import torch in a new process {number} CPU-s",
        line,
    ), line
    assert float(line.rsplit("process ", 1)[1].split()[0]) > 0.1  # torch's import is real work
