"""How fast this machine is right now, by a fixed pure-Python workload on one core, a copy, the
first touch of fresh memory and a new process importing torch, and what its cores did over the
run (busy, idle, taken by the hypervisor): the test run prints both at its end, so that a slower
`make test` can be told apart from a slower machine (the same suite's time has moved by a quarter
between days on the project's VM: docs/testing.md), and a run short of cores from one that leaves
them idle.

The last two are what the suite's ~180 cell processes pay each: on a VM the same commit's suite
can take a third more CPU with the same Python steps/s when `import torch` in a new process and the
first write of fresh pages slow down (the hypervisor backs pages the guest gave back to it on
their first touch)."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

STEPS = 2_000_000  # one round of the arithmetic loop: a fraction of a second
COPY_BYTES = 64 << 20  # one copy: past the caches


def arithmetic_rate() -> float:
    """Million loop steps per second (an integer LCG: the interpreter's dispatch, no allocation)."""
    x, start = 1, time.perf_counter()
    for _ in range(STEPS):
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF
    return STEPS / (time.perf_counter() - start) / 1e6


def copy_rate(source: bytearray, target: bytearray) -> float:
    """GB/s read plus written by one copy of `source` into `target` (both resident)."""
    start = time.perf_counter()
    target[:] = source
    return 2 * len(source) / (time.perf_counter() - start) / 1e9


def first_touch_rate(source: bytearray) -> float:
    """GB/s read plus written by a copy of `source` into a new buffer, whose pages the allocator
    maps afresh (a block this size is its own mmap): what a new process pays for its memory, the
    page faults included. Timed with the allocation: bytearray(n) would touch its pages untimed."""
    start = time.perf_counter()
    copy = bytearray(source)
    elapsed = time.perf_counter() - start
    del copy
    return 2 * len(source) / elapsed / 1e9


def child_cpu_s(code: str) -> float:
    """CPU seconds (user + system) a new Python process running `code` took, from its own rusage."""
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise RuntimeError(f"python -c {code!r} exited with {child.returncode}")
    return usage.ru_utime + usage.ru_stime


def reference(rounds: int = 5) -> str:
    """Medians over `rounds` of the loop's and the copies' rates, and one new process importing
    torch, as one line (about 3 s)."""
    source, target = bytearray(b"\x01" * COPY_BYTES), bytearray(b"\x02" * COPY_BYTES)  # pages resident
    steps = statistics.median(arithmetic_rate() for _ in range(rounds))
    copies = statistics.median(copy_rate(source, target) for _ in range(rounds))
    fresh = statistics.median(first_touch_rate(source) for _ in range(rounds))
    return (
        f"{steps:.1f} M Python steps/s, {copies:.1f} GB/s copied, {fresh:.1f} GB/s into fresh pages,"
        f" import torch in a new process {child_cpu_s('import torch'):.1f} CPU-s"
    )


# --- what the machine's cores did over the run -----------------------------------------------------

# The fields of /proc/stat's first line, in clock ticks summed over the cores (proc(5)); guest time
# is inside user and nice, so it is not counted again.
STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq")
TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_ticks() -> dict[str, int] | None:
    """The cores' cumulated ticks per state, or None where /proc/stat cannot be read (not Linux)."""
    try:
        with open("/proc/stat") as stat:
            values = stat.readline().split()[1:]
    except OSError:
        return None
    return dict(zip(STAT_FIELDS, map(int, values), strict=False))


def usage(start: dict[str, int], end: dict[str, int], cores: int | None = None, ticks_per_s: int = TICKS_PER_S) -> str:
    """One line on the cores between two cpu_ticks(): how busy they were, how much they sat idle
    (a run that leaves cores idle can go faster by ordering; one that does not, only by less work)
    and how much the hypervisor took (steal: a slower VM, not a slower suite)."""
    spent = {name: end[name] - start[name] for name in start}
    total = sum(spent.values()) or 1
    busy = sum(spent[name] for name in BUSY_FIELDS)

    def share(ticks: int) -> str:
        return f"{100 * ticks / total:.1f} %"

    idle, stolen = share(spent["idle"] + spent["iowait"]), share(spent["steal"])
    cores = cores or os.cpu_count()
    return (
        f"{cores} cores: busy {share(busy)} ({busy / ticks_per_s:,.0f} CPU-s by all its processes, the suite's"
        f" and any other), idle {idle}, taken by the hypervisor {stolen}"
    )
