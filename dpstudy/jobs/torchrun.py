"""torchrun, ended without the interpreter's teardown: `python -m dpstudy.jobs.torchrun ARGS` runs
torch.distributed.run's main (what the `torchrun` script runs) on ARGS, then ends the agent with
dpstudy.util.quick_exit.exit_now. The agent imports torch to supervise its ranks, and finalizing
that after they ended cost 0.38 of its 1.63 CPU-s here (a one-rank run of an empty script): once per
multi-process cell and node, after the cell's record is written.

The exit is torchrun's: 0, SystemExit's code, or 1 with the traceback Python would print for an
uncaught exception (ChildFailedError's "Root Cause" block, which dpstudy.jobs.exits reads). An
interrupt (KeyboardInterrupt) ends the agent the way Python ends it."""

from __future__ import annotations

import sys
import traceback

from dpstudy.util.quick_exit import exit_now


def exit_code(stop: SystemExit) -> int:
    """The status Python exits with for SystemExit(code): None 0, an int itself, else 1 (printed)."""
    if stop.code is None:
        return 0
    if isinstance(stop.code, int):
        return stop.code
    print(stop.code, file=sys.stderr)
    return 1


def main() -> None:
    from torch.distributed.run import main as torchrun

    try:
        torchrun()
        code = 0
    except SystemExit as stop:
        code = exit_code(stop)
    except Exception:
        traceback.print_exc()
        code = 1
    exit_now(code)


if __name__ == "__main__":
    main()
