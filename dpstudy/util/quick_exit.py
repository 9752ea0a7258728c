"""Ending a process that imported torch without the interpreter's teardown.

Once a cell's record is written, a process that imported torch spends most of a second finalizing
modules and running C++ static destructors (0.87 s of a 3.4 s one-epoch LeNet cell here, measured
from main's return to the process's end): work whose result nobody reads, paid by every cell of a
pack (benchmarks/packs.py) and every process of the tests. exit_now() does what an exit must
still do, in the order Python does it, then os._exit: threading's shutdown (its exit hooks, which
stop idle pools such as the compiler's worker threads, then a join of the threads that are not
daemons), the atexit handlers (logging's flush, temporary folders' removal, multiprocessing's
children) and a flush of the standard streams.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn


def exit_now(code: int) -> NoReturn:
    """Exit with `code` as a normal exit would, less the teardown (see the module's docstring)."""
    # What the interpreter's exit calls first. Joining the threads without its hooks hangs on an
    # idle ThreadPoolExecutor (torch.compile's workers): the hooks are what tell it to stop.
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or gone: nothing to keep
            pass
    os._exit(code)


def finish(result: int | str | None) -> NoReturn:
    """What `sys.exit(result)` does at the end of a script's main, less the teardown: None is 0, a
    message goes to stderr with 1. For the workflow's scripts and checks that import torch or
    matplotlib, whose teardown takes 0.3-0.9 CPU-s each (the memory plan 0.9, the kernel
    benchmark 1.0, the dataset's preparation 0.5) after the result is written."""
    if result is None:
        exit_now(0)
    if isinstance(result, int):
        exit_now(result)
    print(result, file=sys.stderr)
    exit_now(1)
