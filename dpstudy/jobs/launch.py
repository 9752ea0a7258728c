"""Run one cell as one job: start its processes on the job's GPUs and make sure of how it ends.

  python -m dpstudy.jobs.launch --spec JSON --cell ID --out DIR --log FILE --gpus G --cores C [--attempt K]
      [--limit-s S]

The train rule execs this (G and C per node). It
- starts `python -m dpstudy.engine` (single, dp), `torchrun --standalone` (ddp, fsdp on one node) or,
  inside a SLURM allocation, `srun torchrun --nnodes=N --rdzv-backend=c10d` (ddp, fsdp on N nodes; the
  rendezvous runs on the batch host, where this launcher runs). Outside SLURM a multi-node cell
  runs as one process and train.py records why it was skipped (the command: dpstudy.jobs.cell_command;
  torchrun keeps its log folders in the cell's folder, removed when the processes end);
- gives the cell the GPUs its job reserved: those a scheduler put in CUDA_VISIBLE_DEVICES, else
  free slots of this machine's pool; a job that reserved none sees no GPU (the policy is
  dpstudy.jobs.gpus.job_environment's);
- gives every process of the cell the study's memory allocator (dpstudy.util.allocator: a
  preloaded jemalloc or tcmalloc, or glibc told to keep its memory), found on this node;
- outside SLURM, and inside SLURM where the cell shares its job with others (a pack, whose limit
  is the sum of its cells': dpstudy.workflow.submission), stops the cell at its time limit
  (--limit-s, the study's runtime_min) and records it failed with why (dpstudy.jobs.timelimit);
- tells every process of the cell its pack and its estimated wall time (results/plan/cells.json,
  written when the run started), which its record keeps;
- dies with its parent and takes its child along (dpstudy.util.lifeline). On SIGTERM, SIGINT or
  SIGHUP (a cancelled job, a time limit, Ctrl-C) it stops the child and leaves no record: the
  cell is not finished and the next run reruns it;
- writes a failed record when the child ends without one (the kernel killed a rank, torchrun
  failed; which rank and how: dpstudy.jobs.exits), so the report lists the cell with the reason
  instead of losing it, and the skipped record of a cell that needs CUDA when its job reserved no
  GPU, without starting torch;
- passes the study's collective timeout to every rank (--collective-timeout-s);
- on a retry (attempt > 1) after SLURM stopped the previous attempt at its time or memory limit,
  writes a failed record with SLURM's reason instead of training again (the cluster profiles
  set `retries: 1` for this). A cancelled previous attempt ends the job without a record.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import IO

from dpstudy.jobs import exits, plan_file, slurm, timelimit
from dpstudy.jobs import gpus as gpu_pool
from dpstudy.jobs.cell_command import TORCHRUN_LOGS, command
from dpstudy.record import fields as record
from dpstudy.record.envinfo import ESTIMATE_ENV, PACK_ENV, fallback_environment
from dpstudy.study.resources import processes_per_node
from dpstudy.study.spec import gap_before_start
from dpstudy.util import allocator
from dpstudy.util.atomic import write_json
from dpstudy.util.errors import ConfigError
from dpstudy.util.lifeline import child_dies_with_us, die_with_parent

ATTEMPT_FILE = "attempt.json"
PARENT = os.getppid()  # read first thing: the parent this launcher must not outlive
RECORD_WAIT_S = 10.0
# the command as the log shows it: up to a multi-node cell's rendezvous (srun, torchrun, its options)
SHOWN_ARGS = 14
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Stopped(Exception):
    """A stop signal arrived before the child was started."""


class Launcher:
    def __init__(self, args: argparse.Namespace, log: IO[str]):
        self.args, self.log = args, log
        self.spec = json.loads(args.spec)
        self.out = Path(args.out)
        self.record_path = self.out / "record.json"
        self.child: subprocess.Popen | None = None
        self.stopped_by: int | None = None
        self.t0 = time.time()
        self.plan = plan_file.read(args.cell)
        # Every process of the cell, the launcher's own records too, says how it was planned.
        os.environ[PACK_ENV] = self.plan.get("pack") or ""
        os.environ[ESTIMATE_ENV] = str(self.plan.get("estimate_s") or "")

    def say(self, message: str) -> None:
        print(f"[dpstudy] {message}", file=self.log, flush=True)

    def on_signal(self, signum: int, _frame) -> None:
        self.stopped_by = signum
        if self.child is None:
            raise Stopped()
        if self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM if signum == signal.SIGHUP else signum)

    def run(self) -> int:
        for sig in STOP_SIGNALS:
            signal.signal(sig, self.on_signal)
        try:
            if self.args.attempt > 1:
                decided = self.after_previous_attempt()
                if decided is not None:
                    return decided
            return self.train()
        except Stopped:
            return self.finish_stopped()
        except OSError as error:  # e.g. the results disk full: the job fails with the OS's words, no record
            self.say(f"stopped by an OS error: {error}; no record, the next run reruns this cell")
            return 1

    # ---- the training run -------------------------------------------------------------------

    def train(self) -> int:
        self.out.mkdir(parents=True, exist_ok=True)
        self.record_path.unlink(missing_ok=True)  # an old record must not stand for this run
        gap = gap_before_start(self.spec, self.args.gpus)
        if gap:  # no need to start torch to know
            self.write_record("skipped", gap)
            return 0
        too_big = skip_reason(self.args.memory_plan, self.args.cell) if self.args.memory_plan else None
        if too_big:  # predicted not to fit the study's memory_budget_gib
            self.write_record("skipped", too_big)
            return 0
        try:  # on this node: a cluster's may differ from the host that planned the study
            memory = allocator.resolve(self.args.allocator)
        except ConfigError as error:
            self.write_record("failed", str(error))
            return 0
        job = slurm.job_id()
        allocation = slurm.allocation(job) if job and self.spec["nodes"] > 1 else None
        argv = command(self.spec, self.args.cell, self.out, self.args.cores, allocation)
        with gpu_pool.job_environment(self.args.gpus, say=self.say) as env:
            env = memory.environment(env)  # every rank: torchrun and srun pass it on
            if self.args.collective_timeout_s:  # read by dpstudy.engine.modes.distributed
                env["DPSTUDY_COLLECTIVE_TIMEOUT_S"] = str(self.args.collective_timeout_s)
            self.say(f"allocator: {memory.describe()}")
            write_json(
                self.out / ATTEMPT_FILE,
                {
                    "attempt": self.args.attempt,
                    "host": socket.gethostname(),
                    "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "scheduler": "slurm" if job else "local",
                    "job_id": job,
                    "stdout": slurm.stdout_path(job) if job else None,
                    "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES"),
                    "pack": self.plan.get("pack"),
                },
            )
            self.say(f"running: {' '.join(argv[:SHOWN_ARGS])}{' ...' if len(argv) > SHOWN_ARGS else ''}")
            self.child = subprocess.Popen(
                argv, env=env, stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=child_dies_with_us(signal.SIGTERM)
            )
            # SLURM keeps a job's limit itself (the retry records it): the launcher keeps it elsewhere,
            # and for a packed cell, whose job's limit is the pack's.
            own_limit = not job or self.plan.get("pack")
            code, over = timelimit.wait(self.child, self.args.limit_s if own_limit else None, self.t0)
        shutil.rmtree(self.out / TORCHRUN_LOGS, ignore_errors=True)  # a killed run's too, the next time
        if self.stopped_by is not None:
            return self.finish_stopped()
        if over and not self.record_path.exists():  # a record written just before the stop stands
            ran = time.time() - self.t0
            self.write_record("failed", timelimit.reason(self.args.limit_s, ran, Path(self.args.log), self.out))
            return 0
        return self.finish(code)

    def finish(self, code: int) -> int:
        rec = self.wait_for_record()
        if rec is not None:
            self.say(f"cell {rec['status']}" + (f": {rec['reason']}" if rec["reason"] else ""))
            return 0
        if self.stopped_by is not None:  # stopped while waiting: the job is being torn down
            return self.finish_stopped()
        self.write_record("failed", exits.reason(code, Path(self.args.log), self.out))
        return 0

    def finish_stopped(self) -> int:
        name = signal.Signals(self.stopped_by).name
        self.say(f"stopped by {name}: no record, the next run reruns this cell")
        return 128 + self.stopped_by

    def wait_for_record(self) -> dict | None:
        # Rank 0 of a multi-node cell may write on another node: give the shared FS a moment.
        deadline = time.monotonic() + (RECORD_WAIT_S if self.spec["nodes"] > 1 else 0)
        while True:
            try:
                return record.read(self.record_path)
            except (OSError, ValueError):
                if time.monotonic() > deadline or self.stopped_by is not None:
                    return None
                time.sleep(0.2)

    def write_record(self, status: str, reason: str) -> None:
        """The record of a cell that ended here, without a training process to write it."""
        nodes = self.spec["nodes"]
        env = fallback_environment(processes_per_node(self.spec) * nodes, nodes)
        record.write(
            self.record_path,
            record.make(self.args.cell, status, reason, self.spec, env, summary={"total_s": time.time() - self.t0}),
        )
        self.say(f"cell {status}: {reason}")

    # ---- retries ----------------------------------------------------------------------------

    def after_previous_attempt(self) -> int | None:
        """The exit code when SLURM's verdict on the previous attempt decides the job; None: train."""
        previous = self.previous_slurm_job()
        if previous is None:
            self.say(f"attempt {self.args.attempt}: the previous attempt left no scheduler verdict; training again")
            return None
        verdict = slurm.verdict(*previous)
        self.say(f"attempt {self.args.attempt}: {verdict.text}")
        if verdict.kind in ("time", "memory"):
            self.write_record("failed", verdict.text)
            return 0
        if verdict.kind == "cancelled":
            self.say("not training again in this run: run snakemake again to rerun the cell")
            return 1
        return None

    def previous_slurm_job(self) -> tuple[str, str | None] | None:
        """(job id, output file) of the previous attempt's SLURM job, if there was one."""
        job = slurm.job_id()
        beside = slurm.earlier_job(slurm.stdout_path(job)) if job else None
        if beside:
            return beside
        try:
            previous = json.loads((self.out / ATTEMPT_FILE).read_text())
        except (OSError, ValueError):
            return None
        if previous.get("scheduler") != "slurm" or not previous.get("job_id") or previous["job_id"] == job:
            return None
        return previous["job_id"], previous.get("stdout")


def skip_reason(path: str, cell: str) -> str | None:
    """Why the memory plan at `path` keeps `cell` from launching, or None (also when it lacks the
    cell). The plan is written where Snakemake plans (dpstudy.workflow.memory_plan); the cell's
    job reads its own verdict here."""
    with open(path, newline="") as f:
        return next((row["skip"] for row in csv.DictReader(f) if row["cell"] == cell and row["skip"]), None)


@contextlib.contextmanager
def open_log(path: str, attempt: int) -> Iterator[IO[str]]:
    """The job's log: a new file for the first attempt, appended to for retries."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w" if attempt <= 1 else "a", buffering=1) as log:
        yield log


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", required=True, help="the cell's complete spec, a JSON object")
    parser.add_argument("--cell", required=True, help="cell id")
    parser.add_argument("--out", required=True, help="the cell's folder (record.json goes there)")
    parser.add_argument("--log", required=True, help="log file of the job")
    parser.add_argument("--gpus", type=int, required=True, help="GPUs the job reserved per node (0: none)")
    parser.add_argument("--cores", type=int, required=True, help="CPU cores of the cell per node")
    parser.add_argument("--attempt", type=int, default=1, help="Snakemake's attempt number (retries)")
    parser.add_argument("--limit-s", type=float, help="wall-time limit of the job in seconds (default: none)")
    parser.add_argument(
        "--collective-timeout-s", type=float, help="timeout of the ranks' collectives (default: torch's)"
    )
    parser.add_argument("--memory-plan", help="the memory plan CSV (dpstudy.workflow.memory_plan)")
    parser.add_argument(
        "--allocator", choices=allocator.CHOICES, default="auto", help="the study's allocator (dpstudy.util.allocator)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    die_with_parent(signal.SIGTERM, PARENT)  # Snakemake killed: stop (and take the child along)
    with open_log(args.log, args.attempt) as log:
        launcher = Launcher(args, log)
        launcher.say(
            f"cell {args.cell}, attempt {args.attempt}, on {socket.gethostname()}"
            + (f", SLURM job {slurm.job_id()}" if slurm.job_id() else "")
        )
        return launcher.run()


if __name__ == "__main__":
    sys.exit(main())
