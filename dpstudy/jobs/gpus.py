"""A lock-based GPU slot pool: concurrent jobs on one machine get distinct GPUs.

  python -m dpstudy.jobs.gpus --gpus N -- COMMAND ...

takes N free slots (one flock'd file per GPU), runs COMMAND with CUDA_VISIBLE_DEVICES set to
them and releases them when it ends. flock locks belong to the open file: when the holder dies,
even by SIGKILL, the kernel releases them, so a killed job never strands its GPUs. A
CUDA_VISIBLE_DEVICES already set (by SLURM, say) is respected: the pool stays out of the way.
A job that reserved no GPU (N = 0) sees none: CUDA_VISIBLE_DEVICES is set empty, so it cannot
use the GPUs other jobs reserved. `job_environment` is that policy, stated once; the cell
launcher (dpstudy.jobs.launch) follows it too.
Reading the GPU count uses NVML, not torch, so taking a slot costs milliseconds.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from dpstudy.util import nvml
from dpstudy.util.lifeline import child_dies_with_us

DEFAULT_POOL = Path(tempfile.gettempdir()) / f"dpstudy-gpu-slots-{os.getuid()}"


def visible_gpu_count() -> int:
    return nvml.gpu_count()  # no driver: no GPUs


def try_lock(path: Path):
    f = open(path, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    return f


@contextmanager
def acquire(
    n: int, total: int, pool: Path = DEFAULT_POOL, timeout_s: float = 86400, poll_s: float = 0.5
) -> Iterator[list[int]]:
    """Hold n of the `total` slots (GPU indices) until the block ends; waits while they are busy."""
    if n > total:
        raise ValueError(f"{n} GPUs requested but the pool has {total}")
    pool.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    while True:
        held = []
        for index in range(total):
            lock = try_lock(pool / f"gpu{index}.lock")
            if lock is not None:
                held.append((index, lock))
                if len(held) == n:
                    break
        if len(held) == n:
            break
        for _, lock in held:  # all or nothing, so two jobs never deadlock on half each
            lock.close()
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {n} free GPU slots in {pool} after {timeout_s} s")
        time.sleep(poll_s)
    try:
        yield [index for index, _ in held]
    finally:
        for _, lock in held:
            lock.close()


@contextmanager
def job_environment(
    gpus: int, pool: Path = DEFAULT_POOL, say: Callable[[str], object] = lambda _message: None
) -> Iterator[dict[str, str]]:
    """The environment of a job that reserved `gpus` GPUs per node on this machine, for as long as
    the block runs: the one statement of which GPUs a job may see.

    - none reserved: CUDA_VISIBLE_DEVICES is empty, hiding every GPU (a scheduler's too), so the
      job cannot use GPUs other jobs reserved;
    - CUDA_VISIBLE_DEVICES already set (a scheduler chose the GPUs): kept;
    - more than this machine has (none without a driver): unchanged, and the program finds too
      few and says so (a cell records its skip);
    - else `gpus` free slots of the pool, held until the block ends (`say` is told which).
    """
    env = dict(os.environ)
    if gpus == 0:
        env["CUDA_VISIBLE_DEVICES"] = ""
        yield env
        return
    total = visible_gpu_count()
    if "CUDA_VISIBLE_DEVICES" in env or gpus > total:
        yield env
        return
    with acquire(gpus, total, pool) as slots:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, slots))
        say(f"GPU slots {slots}")
        yield env


def run(command: list[str], n: int, pool: Path = DEFAULT_POOL) -> int:
    """Run `command` as a job that reserved `n` GPUs (job_environment); its exit status."""
    with job_environment(
        n, pool, say=lambda message: print(f"[dpstudy] {message}", file=sys.stderr, flush=True)
    ) as env:
        child = subprocess.Popen(command, env=env, preexec_fn=child_dies_with_us())
        # Pass termination on, so cancelling the job stops what it started.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda s, _f: child.send_signal(s))
        return child.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description="Run a command on N free GPUs of this machine.")
    parser.add_argument("--gpus", type=int, required=True)
    parser.add_argument("--pool", type=Path, default=DEFAULT_POOL)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given after --")
    return run(command, args.gpus, args.pool)


if __name__ == "__main__":
    sys.exit(main())
