"""How a cell's processes ended without a record, in words for the failed record's reason.

When a rank dies (SIGKILL from the kernel's out-of-memory killer, a segfault, os._exit), torchrun
stops the other ranks and prints its own failure report; the first observed failure names the
rank, its exit code and pid. The reason says which rank died and how, where the ranks' heartbeats
(dpstudy.engine.heartbeat) last saw it, and not torchrun's wrapper text.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

from dpstudy.engine import heartbeat

# torchrun's "Root Cause (first observed failure):" block (torch.distributed.elastic's ChildFailedError).
ROOT_CAUSE = re.compile(
    r"Root Cause \(first observed failure\):.*?rank\s*:\s*(?P<rank>\d+) \(local_rank: \d+\)\s*"
    r"exitcode\s*:\s*(?P<code>-?\d+) \(pid: (?P<pid>\d+)\)",
    re.S,
)
OOM_HINT = " (the kernel's out-of-memory killer?)"


def describe_exit(code: int) -> str:
    """'killed by SIGKILL' for a negative (signal) code, else 'exit code N'."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def first_failure(log_text: str) -> tuple[int, int] | None:
    """(rank, exit code) of torchrun's first observed failure in the job's log, if it reported one."""
    found = list(ROOT_CAUSE.finditer(log_text))
    if not found:
        return None
    return int(found[-1]["rank"]), int(found[-1]["code"])  # the last report: a retry's, if several


def reason(code: int, log: Path, out_dir: Path) -> str:
    """The failed record's reason for processes that ended (the launcher's child's `code`) without
    writing a record."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        text = ""
    failure = first_failure(text)
    if failure is None:
        why = f"the training processes ended ({describe_exit(code)}) without writing a record"
        return why + (OOM_HINT if code in (-signal.SIGKILL, 128 + signal.SIGKILL) else "") + "; see train.log"
    rank, rank_code = failure
    how = describe_exit(rank_code) if rank_code < 0 else f"exited with code {rank_code}"
    beats = heartbeat.read(out_dir)
    beat = next((b for b in beats if b.rank == rank), None)
    where = f" {beat.where()}" if beat else ""
    hint = OOM_HINT if rank_code == -signal.SIGKILL else ""
    died = f"rank {rank} {how}{hint}{where}, without a record"
    # It may have ended waiting for a peer that never came (NCCL's watchdog ends the process).
    peer = heartbeat.culprit(beats, rank, check_alive=False)  # every rank has ended by now
    if peer is not None:
        died = f"{peer}; then {died}"
    return f"{died}; torchrun stopped the other ranks; see train.log"
