"""How the probes time a step (dpstudy.engine.probe, dpstudy.engine.zero_probe): the batches they
take, how many steps they can afford, and the step with its communication against the same step
without it, in turns."""

from __future__ import annotations

import itertools
import math
import statistics
import time

STEPS = 8
# A step that takes long varies little relative to its length: a variant stops adding steps once
# they would take more than PROBE_S (at least MIN_STEPS, an average of two), so slow models on
# CPU do not spend longer probing than training.
PROBE_S = 2.0
MIN_STEPS = 2
# A step with its communication and the same step without it take turns in ROUNDS rounds, so a
# drift of the machine touches both alike; the rounds' differences give the exposed time's spread.
ROUNDS = 4


def batches(trainer, count: int) -> list:
    trainer.train_data.set_epoch(trainer.spec["epochs"] + 1)
    return list(itertools.islice(iter(trainer.train_data), count))


def affordable_steps(trainer, warm_up_s: float, steps: int) -> int:
    """`steps`, or fewer when the slowest rank's warm-up step says they would pass PROBE_S (the
    same number on every rank: each step is collective)."""
    slowest = max(trainer.mode.all_gather_floats([warm_up_s]))
    return max(MIN_STEPS, min(steps, math.ceil(PROBE_S / slowest))) if slowest > 0 else steps


def timed_once(trainer, work) -> float:
    trainer.mode.synchronize()
    start = time.perf_counter()
    work()
    trainer.mode.synchronize()
    return time.perf_counter() - start


def per_step(trainer, work, steps: int) -> float:
    """Seconds per call of work() over `steps` calls, after a device synchronize."""
    trainer.mode.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        work()
    trainer.mode.synchronize()
    return (time.perf_counter() - start) / steps


def interleaved(trainer, with_comm, without_comm, steps: int) -> dict:
    """`with_comm` and `without_comm` timed in turns over ROUNDS rounds of about steps / ROUNDS
    steps each (at least one), each round's times the slowest rank's: the median step of each
    (sync_step_s, nosync_step_s), the median of the rounds' differences (exposed_s, the
    communication the step did not hide) and their interquartile range (exposed_spread_s)."""
    each = max(1, math.ceil(steps / ROUNDS))
    times = []
    for _ in range(ROUNDS):
        times += [per_step(trainer, with_comm, each), per_step(trainer, without_comm, each)]
    every = trainer.mode.all_gather_floats(times)  # rank by rank
    worst = [max(every[i :: len(times)]) for i in range(len(times))]
    synced, unsynced = worst[0::2], worst[1::2]
    exposed = [a - b for a, b in zip(synced, unsynced, strict=True)]
    quartiles = statistics.quantiles(exposed, n=4, method="inclusive")
    return {
        "sync_step_s": statistics.median(synced),
        "nosync_step_s": statistics.median(unsynced),
        "exposed_s": statistics.median(exposed),
        "exposed_spread_s": quartiles[2] - quartiles[0],
        "rounds": ROUNDS,
    }


def timed(trainer, totals: dict, key: str, work):
    """work()'s result; its seconds (between device synchronizes) added to totals[key]."""
    trainer.mode.synchronize()
    start = time.perf_counter()
    result = work()
    trainer.mode.synchronize()
    totals[key] += time.perf_counter() - start
    return result
