"""Processes that die with the process that started them.

torchrun starts every rank in a session of its own, so killing a job's process group, or
torchrun itself with SIGKILL, used to leave the ranks training (and writing a record later).
Linux's parent-death signal (prctl PR_SET_PDEATHSIG) ties a process to its parent instead: when
the parent dies, however it dies, the kernel sends the signal. The launcher ties itself to
Snakemake, its child (torchrun, srun or python) to itself, and every rank ties itself to torchrun.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL, parent: int | None = None) -> bool:
    """Have the kernel send `sig` to this process when its parent dies; False where unsupported.

    `parent` is the pid the caller believes is its parent: if that one died before the call
    (the signal would then never come), `sig` is delivered at once.
    """
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_PDEATHSIG): {os.strerror(errno)}")
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), sig)
    return True


def child_dies_with_us(sig: int = signal.SIGTERM):
    """A subprocess.Popen preexec_fn: the child gets `sig` when this process dies."""
    parent = os.getpid()
    return lambda: die_with_parent(sig, parent)
