"""Short subprocess queries that must never hang a job, and whose failure is an answer: git's
commit, SLURM's and the other schedulers' client tools, a compiler's --version."""

from __future__ import annotations

import subprocess


def output_of(argv: list[str], timeout_s: float = 30, **kwargs) -> str | None:
    """The command's stripped stdout, or None when it cannot start, fails or runs past `timeout_s`."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, **kwargs)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None
