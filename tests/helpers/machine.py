"""How fast this machine is right now, by a fixed pure-Python workload on one core: the test run
prints it at its start and its end, so that a slower `make test` can be told apart from a slower
machine (the same suite took 13 m 52 s one day and 17 m 05 s another here)."""

from __future__ import annotations

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
