"""Submit, watch and cancel jobs on PBS Pro, SGE and LSF (and SLURM): the commands that
snakemake-executor-plugin-cluster-generic runs for profiles/cluster-generic.

  python -m dpstudy.jobs.schedulers --scheduler pbs submit JOBSCRIPT   # prints the job id
  python -m dpstudy.jobs.schedulers --scheduler pbs status JOBID       # running | success | failed
  python -m dpstudy.jobs.schedulers --scheduler pbs cancel JOBID ...

A job's request comes from the resources in its job script, the names the SLURM profile reads
(dpstudy.study.resources): gpu or gres (GPUs per node), cpus_per_task or cpus_per_gpu, mem_mb (per
node), runtime (minutes), nodes; queue and account from `--default-resources queue=... account=...`.
SLURM is here so that this path runs in the tests against a real scheduler.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from dpstudy.util.proc import output_of

SCHEDULERS = ("pbs", "sge", "lsf", "slurm")
RUNNING, SUCCESS, FAILED = "running", "success", "failed"


@dataclass(frozen=True)
class Request:
    name: str
    nodes: int
    cpus: int  # per node
    gpus: int  # per node
    mem_mb: int  # per node
    runtime_min: int
    queue: str | None
    account: str | None
    log: str


def read_properties(jobscript: str | Path) -> dict:
    """The job properties Snakemake writes into every job script (`# properties = {...}`)."""
    for line in Path(jobscript).read_text().splitlines():
        if line.startswith("# properties = "):
            return json.loads(line.removeprefix("# properties = "))
    raise ValueError(f"{jobscript}: no '# properties = ' line; is it a Snakemake job script?")


def request_of(properties: dict, log_dir: str = ".snakemake/cluster_logs") -> Request:
    res = properties.get("resources", {})
    gres = re.fullmatch(r"gpu(?::\w+)?:(\d+)", str(res.get("gres", "")))
    gpus = int(res.get("gpu") or (gres.group(1) if gres else 0))
    cpus = res.get("cpus_per_task") or (res.get("cpus_per_gpu", 0) * gpus) or properties.get("threads", 1)
    wildcards = "_".join(f"{v}" for v in properties.get("wildcards", {}).values())
    name = "dpstudy." + properties.get("rule", "job") + (f".{wildcards}" if wildcards else "")
    return Request(
        name=name[:100],
        nodes=int(res.get("nodes", 1)),
        cpus=int(cpus),
        gpus=gpus,
        mem_mb=int(res.get("mem_mb", 1000)),
        runtime_min=int(res.get("runtime", 60)),
        queue=res.get("queue"),
        account=res.get("account"),
        log=f"{log_dir}/{name[:100]}.%j.log",
    )


def hms(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}:00"


def check(scheduler: str) -> None:
    if scheduler not in SCHEDULERS:
        raise ValueError(f"scheduler {scheduler!r} is not one of {', '.join(SCHEDULERS)}")


QUEUE_AND_ACCOUNT_FLAGS = {"pbs": ("-q", "-A"), "sge": ("-q", "-P"), "lsf": ("-q", "-P"), "slurm": ("-p", "-A")}


def submit_command(scheduler: str, r: Request, jobscript: str) -> list[str]:
    """The submission command; LSF's bsub reads the script from stdin (see submit())."""
    check(scheduler)
    queue, account = QUEUE_AND_ACCOUNT_FLAGS[scheduler]
    cmd = request_flags(scheduler, r)
    cmd += [queue, r.queue] if r.queue else []
    cmd += [account, r.account] if r.account else []
    return cmd if scheduler == "lsf" else [*cmd, jobscript]


def request_flags(scheduler: str, r: Request) -> list[str]:
    # The job id in the log's name: SGE expands $JOB_ID, LSF %J, SLURM %j; PBS names the file
    # itself when given a folder.
    log = r.log.replace("%j", {"pbs": "", "sge": "$JOB_ID", "lsf": "%J", "slurm": "%j"}[scheduler])
    mem_per_cpu = max(1, r.mem_mb // max(r.cpus, 1))
    if scheduler == "pbs":  # PBS Pro / OpenPBS select syntax
        chunk = f"select={r.nodes}:ncpus={r.cpus}:mem={r.mem_mb}mb" + (f":ngpus={r.gpus}" if r.gpus else "")
        return [
            "qsub",
            "-N",
            r.name[:15],
            "-l",
            chunk,
            "-l",
            f"walltime={hms(r.runtime_min)}",
            "-j",
            "oe",
            "-o",
            str(Path(log).parent) + "/",
            "-V",
        ]
    if scheduler == "sge":  # h_vmem is per slot
        limits = f"h_rt={hms(r.runtime_min)},h_vmem={mem_per_cpu}M" + (f",gpu={r.gpus}" if r.gpus else "")
        return [
            "qsub",
            "-terse",
            "-cwd",
            "-V",
            "-N",
            r.name,
            "-pe",
            "smp",
            str(r.cpus),
            "-l",
            limits,
            "-j",
            "y",
            "-o",
            log,
        ]
    if scheduler == "lsf":  # rusage mem is per slot, in MB (LSF_UNIT_FOR_LIMITS=MB)
        return [
            "bsub",
            "-J",
            r.name,
            "-n",
            str(r.cpus * r.nodes),
            "-R",
            f"span[ptile={r.cpus}] rusage[mem={mem_per_cpu}]",
            "-W",
            str(r.runtime_min),
            "-o",
            log,
            *(["-gpu", f"num={r.gpus}"] if r.gpus else []),
        ]
    return [
        "sbatch",
        "--parsable",
        "-J",
        r.name,
        f"--nodes={r.nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={r.cpus}",
        f"--mem={r.mem_mb}",
        f"--time={r.runtime_min}",
        "-o",
        log,
        *([f"--gres=gpu:{r.gpus}"] if r.gpus else []),
    ]


def parse_job_id(scheduler: str, out: str) -> str:
    pattern = {"pbs": r"^(\S+)", "sge": r"^(\d+)", "lsf": r"Job <(\d+)>", "slurm": r"^(\d+)"}[scheduler]
    match = re.search(pattern, out.strip())
    if not match:
        raise ValueError(f"no job id in the {scheduler} submission output: {out.strip()!r}")
    return match.group(1)


def status_of(scheduler: str, job: str, run=None) -> str:
    """running, success or failed, from the scheduler's own view of `job`."""
    check(scheduler)
    run = run or _run
    if scheduler == "pbs":
        out = run("qstat", "-x", "-f", "-F", "json", job)
        info = next(iter(json.loads(out)["Jobs"].values())) if out else {}
        if info.get("job_state") != "F":
            return RUNNING
        return SUCCESS if str(info.get("Exit_status")) == "0" else FAILED
    if scheduler == "sge":
        if run("qstat", "-j", job) is not None:
            return RUNNING
        out = run("qacct", "-j", job) or ""
        failed = re.search(r"^failed\s+(\d+)", out, re.M)
        code = re.search(r"^exit_status\s+(\d+)", out, re.M)
        if not code:
            return RUNNING  # not accounted yet
        return SUCCESS if code.group(1) == "0" and (not failed or failed.group(1) == "0") else FAILED
    if scheduler == "lsf":
        state = (run("bjobs", "-noheader", "-o", "stat", job) or "").strip()
        return {"DONE": SUCCESS, "EXIT": FAILED}.get(state, RUNNING)
    out = (
        run("sacct", "-j", job, "-X", "-n", "-P", "-o", "State")
        or run("squeue", "--states=all", "-h", "-o", "%T", "-j", job)
        or ""
    )
    state = out.strip().split()[0] if out.strip() else "PENDING"
    if state == "COMPLETED":
        return SUCCESS
    running = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED")
    return RUNNING if state in running else FAILED


def cancel_command(scheduler: str, jobs: list[str]) -> list[str]:
    return [{"pbs": "qdel", "sge": "qdel", "lsf": "bkill", "slurm": "scancel"}[scheduler], *jobs]


def _run(*argv: str) -> str | None:
    """A scheduler query's stdout; None when the command is missing, fails or hangs (60 s), which
    status_of reads as a job still running (asked again later) rather than a failed one."""
    return output_of(list(argv), timeout_s=60)


def submit(scheduler: str, jobscript: str) -> str:
    r = request_of(read_properties(jobscript))
    Path(r.log).parent.mkdir(parents=True, exist_ok=True)
    argv = submit_command(scheduler, r, jobscript)
    script = Path(jobscript).read_text() if scheduler == "lsf" else None  # bsub reads it from stdin
    done = subprocess.run(argv, input=script, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return parse_job_id(scheduler, done.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scheduler", choices=SCHEDULERS, required=True)
    parser.add_argument("action", choices=("submit", "status", "cancel"))
    parser.add_argument("targets", nargs="+", help="the job script (submit) or job ids")
    args = parser.parse_args(argv)
    if args.action == "submit":
        print(submit(args.scheduler, args.targets[0]))
    elif args.action == "status":
        print(status_of(args.scheduler, args.targets[0]))
    else:
        return subprocess.call(cancel_command(args.scheduler, args.targets))
    return 0


if __name__ == "__main__":
    sys.exit(main())
