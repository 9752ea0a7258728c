"""How fast this machine is right now, by a fixed pure-Python workload on one core, and what its
cores did over the run (busy, idle, taken by the hypervisor): the test run prints both at its
end, so that a slower `make test` can be told apart from a slower machine (the same suite took
13 m 52 s one day and 17 m 05 s another here), and a run short of cores from one that leaves
them idle."""

from __future__ import annotations

import os
import statistics
import time

STEPS = 2_000_000  # one round of the arithmetic loop: about 0.15 s here
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


def reference(rounds: int = 5) -> str:
    """Medians over `rounds` of both rates, as one line (about 1 s)."""
    source, target = bytearray(b"\x01" * COPY_BYTES), bytearray(b"\x02" * COPY_BYTES)  # pages resident
    steps = statistics.median(arithmetic_rate() for _ in range(rounds))
    copies = statistics.median(copy_rate(source, target) for _ in range(rounds))
    return f"{steps:.1f} M Python steps/s, {copies:.1f} GB/s copied"


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
