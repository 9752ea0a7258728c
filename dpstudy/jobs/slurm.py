"""What SLURM knows about a job: its allocation, where its output went, and why it ended.

The launcher asks these questions from inside a job (SLURM_JOB_ID set), with SLURM's own client
tools. sacct needs the accounting database; where there is none (or a job aged out of it),
scontrol answers from the controller, and the job's output file holds slurmstepd's messages.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from dpstudy.util.proc import output_of

# slurmstepd's words when it stops a job for its limits (cgroup and jobacct_gather alike)
TIME_LIMIT = re.compile(r"DUE TO TIME LIMIT", re.IGNORECASE)
MEMORY_LIMIT = re.compile(
    r"^.*(exceeded (job )?memory limit|oom[-_ ]kill|out of memory).*$", re.IGNORECASE | re.MULTILINE
)
USED_OVER_LIMIT = re.compile(r"\(\d+ > \d+\)")
_KEY_VALUE = re.compile(r"(\w[\w:/]*)=(.*?)(?=\s+\w[\w:/]*=|$)")


def job_id() -> str | None:
    """This process's SLURM job, if it runs in one."""
    return os.environ.get("SLURM_JOB_ID")


def run(*command: str) -> str | None:
    """stdout of a SLURM client command, or None when it is missing, fails or hangs (30 s)."""
    return output_of(list(command), timeout_s=30)


def scontrol(kind: str, name: str) -> dict[str, str]:
    """`scontrol show job|node NAME` as {key: value}; empty when the controller does not know it."""
    out = run("scontrol", "show", kind, "--oneliner", name)
    return dict(_KEY_VALUE.findall(out.strip())) if out else {}


@dataclass(frozen=True)
class Allocation:
    job_id: str
    nodes: int
    head: str  # address of the batch host, where this launcher runs: the rendezvous host


def allocation(job: str) -> Allocation | None:
    info = scontrol("job", job)
    if not info.get("NumNodes") or not info.get("BatchHost"):
        return None
    nodes = int(info["NumNodes"].split("-")[0])
    head = scontrol("node", info["BatchHost"]).get("NodeAddr") or info["BatchHost"]
    return Allocation(job, nodes, head)


def stdout_path(job: str) -> str | None:
    return scontrol("job", job).get("StdOut")


def earlier_job(own_stdout: str | None) -> tuple[str, str] | None:
    """(job id, output file) of the newest earlier job whose output lies beside this job's own.

    Snakemake's SLURM executor writes every attempt of a job to `<job id>.log` in one folder per
    rule and wildcards, so the newest earlier file there is the previous attempt, even one that
    SLURM stopped before this launcher ran (its batch step over the memory limit) and that so
    left no attempt file of ours."""
    if not own_stdout or not Path(own_stdout).stem.isdigit():
        return None
    own = Path(own_stdout)
    earlier = [p for p in own.parent.glob("*.log") if p.stem.isdigit() and int(p.stem) < int(own.stem)]
    if not earlier:
        return None
    newest = max(earlier, key=lambda p: int(p.stem))
    return newest.stem, str(newest)


@dataclass(frozen=True)
class Verdict:
    kind: str  # time | memory | cancelled | other
    text: str  # the scheduler's words, for a record's reason


def job_state(job: str) -> dict[str, str]:
    """State, reason, elapsed and time limit of a job: from sacct, else from scontrol."""
    out = run("sacct", "-j", job, "-X", "-n", "-P", "-o", "State,Reason,Elapsed,Timelimit")
    if out and out.strip():
        state, reason, elapsed, limit = out.strip().splitlines()[0].split("|")[:4]
        return {"state": state, "reason": reason, "elapsed": elapsed, "limit": limit}
    info = scontrol("job", job)
    return {
        "state": info.get("JobState", ""),
        "reason": info.get("Reason", ""),
        "elapsed": info.get("RunTime", ""),
        "limit": info.get("TimeLimit", ""),
    }


def memory_line(text: str) -> str | None:
    """slurmstepd's line about the memory limit: the one with the numbers (used > limit) when it
    printed one. It writes several, in no fixed order, and some say only 'Exceeded job memory limit'."""
    lines = [m.group(0).strip() for m in MEMORY_LIMIT.finditer(text)]
    return next((line for line in lines if USED_OVER_LIMIT.search(line)), lines[0] if lines else None)


def verdict(job: str, output: str | None) -> Verdict:
    """Why SLURM job `job` ended, from its state and from slurmstepd's lines in its output file."""
    facts = job_state(job)
    state = facts["state"] or "unknown"
    text = Path(output).read_text(errors="replace") if output and Path(output).is_file() else ""
    said = f"state {state}" + (f", reason {facts['reason']}" if facts["reason"] not in ("", "None") else "")
    if state.startswith("TIMEOUT") or TIME_LIMIT.search(text):
        limit = f" of {facts['limit']}" if facts["limit"] else ""
        ran = f" after {facts['elapsed']}" if facts["elapsed"] else ""
        return Verdict("time", f"SLURM job {job} was stopped at its time limit{limit}{ran} ({said})")
    memory = memory_line(text)
    if state.startswith("OUT_OF_MEMORY") or memory:
        detail = f": {memory}" if memory else ""
        return Verdict("memory", f"SLURM job {job} was stopped at its memory limit ({said}){detail}")
    if state.startswith("CANCELLED"):
        return Verdict("cancelled", f"SLURM job {job} was cancelled ({said})")
    return Verdict("other", f"SLURM job {job} ended ({said})")
