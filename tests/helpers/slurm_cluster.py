"""A private SLURM for the cluster tests: munged, slurmctld and two slurmd "nodes" on this machine.

How it is set up: Debian's SLURM 22.05, munge auth on a socket of its
own, eight fake GPUs per node (character devices, so gres accounting and CUDA_VISIBLE_DEVICES are
real while the cells run on the CPU), a second slurmd started with -N and a port of its own. Each
node claims eight CPUs, whatever this machine has (config_overrides): a test's jobs all start at
once instead of queueing for slots on a small machine. Everything lives in one temporary folder and
is stopped by pid, whatever happens; nothing system-wide is touched.

    python tests/helpers/slurm_cluster.py DIR     # start one by hand; Ctrl-C stops it
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DAEMONS = ("slurmctld", "slurmd", "munged")
CLIENTS = ("sbatch", "srun", "squeue", "scancel", "scontrol", "sinfo", "sacct", "sacctmgr", "sshare")
# What the tests ask `sacct` of each job (TimelimitRaw: minutes)
SACCT_FIELDS = ("JobID", "JobName", "State", "TimelimitRaw", "Submit", "Start", "End", "NodeList", "WorkDir")
NODES = ("n1", "n2")
CPUS_PER_NODE = 8
GPUS_PER_NODE = 8
MEMORY_MB = 16000
# `snakemake --profile profiles/slurm` as the tests run it: the first status check after 1 s instead
# of 40 s. (The executor waits 10 s longer after each check that saw no job complete, and 1 s again
# after one that did.)
SLURM_ARGS = (
    "--profile",
    "profiles/slurm",
    "--slurm-status-command",
    "squeue",
    "--slurm-init-seconds-before-status-checks",
    "1",
)


def unavailable() -> str | None:
    """Why no private SLURM can run here, or None."""
    missing = [d for d in (*DAEMONS, "sbatch", "scontrol") if shutil.which(d) is None]
    if missing:
        return (
            f"SLURM is not installed ({', '.join(missing)} missing); `make test` installs Debian's "
            "slurmctld slurmd slurm-client munge when it runs as root"
        )
    if os.geteuid() != 0:
        return "the private SLURM needs root (slurmd runs jobs as any user, the fake GPUs need mknod)"
    return None


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class SlurmCluster:
    """Start with start(), stop with stop(); `env` is what a client command needs (SLURM_CONF)."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root or tempfile.mkdtemp(prefix="dpslurm-"))  # short: unix socket paths
        self.conf = self.root / "slurm.conf"
        self.jobcomp = self.root / "jobcomp.txt"
        self.bin = self.root / "bin"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf), "PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}"}
        self.host = socket.gethostname().split(".")[0]

    # ---- set-up -----------------------------------------------------------------------------

    def write_config(self) -> None:
        for sub in ("state", "spool", "log"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        ctld_port, *node_ports = free_ports(1 + len(NODES))
        gres = []
        node_lines = []
        for i, (node, port) in enumerate(zip(NODES, node_ports)):
            first, last = i * GPUS_PER_NODE, (i + 1) * GPUS_PER_NODE - 1
            for g in range(first, last + 1):
                if not (self.root / f"gpu{g}").exists():  # a character device like /dev/null
                    os.mknod(self.root / f"gpu{g}", 0o644 | stat.S_IFCHR, os.makedev(1, 3))
            gres.append(f"NodeName={node} Name=gpu File={self.root}/gpu[{first}-{last}]")
            node_lines.append(
                f"NodeName={node} NodeHostname={self.host} NodeAddr=127.0.0.1 Port={port} "
                f"CPUs={CPUS_PER_NODE} RealMemory={MEMORY_MB} Gres=gpu:{GPUS_PER_NODE}"
            )
        r = self.root
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=dpstudy",
                    f"SlurmctldHost={self.host}(127.0.0.1)",
                    f"SlurmctldPort={ctld_port}",
                    "AuthType=auth/munge",
                    f"AuthInfo=socket={r}/munge.sock",
                    "CredType=cred/munge",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    # The least loaded node first: neither node fills while the other is idle, which
                    # would hold a two-node job (and every job queued behind it) back.
                    "SelectTypeParameters=CR_Core_Memory,CR_LLN",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    f"StateSaveLocation={r}/state",
                    f"SlurmdSpoolDir={r}/spool/%n",
                    f"SlurmctldPidFile={r}/slurmctld.pid",
                    f"SlurmdPidFile={r}/slurmd-%n.pid",
                    f"SlurmctldLogFile={r}/log/slurmctld.log",
                    f"SlurmdLogFile={r}/log/slurmd-%n.log",
                    "AccountingStorageType=accounting_storage/none",
                    # Memory limits are enforced by polling (no cgroups here): a job over its --mem is killed.
                    "JobAcctGatherType=jobacct_gather/linux",
                    "JobAcctGatherFrequency=task=1",
                    "JobAcctGatherParams=OverMemoryKill",
                    # The controller's own line per finished job, which `sacct --completion` reads:
                    # the tests' job accounting without an accounting database.
                    "JobCompType=jobcomp/filetxt",
                    f"JobCompLoc={self.jobcomp}",
                    "GresTypes=gpu",
                    "MinJobAge=3600",
                    "KillWait=5",
                    "ReturnToService=2",
                    "MpiDefault=none",
                    # Jobs the main scheduler passes over (queued behind one that does not fit yet)
                    # start in a backfill pass: every second here, not every 30 s.
                    "SchedulerParameters=sched_interval=2,bf_interval=1",
                    # The nodes' CPUs and memory as configured, not as this machine has them.
                    "SlurmdParameters=config_overrides",
                    "PriorityType=priority/basic",
                    *node_lines,
                    "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
                ]
            )
            + "\n"
        )
        (self.root / "gres.conf").write_text("\n".join(gres) + "\n")

    def write_clients(self) -> None:
        """Client commands that find this cluster's config the way a real cluster's find
        /etc/slurm/slurm.conf: the slurm executor plugin clears SLURM_* variables (SLURM_CONF
        among them) before its nested srun, and jobs call scontrol and srun themselves."""
        self.bin.mkdir(parents=True, exist_ok=True)
        for name in CLIENTS:
            real = shutil.which(name, path=os.environ["PATH"])
            if real:
                shim = self.bin / name
                shim.write_text(f'#!/bin/sh\nSLURM_CONF={self.conf} exec {real} "$@"\n')
                shim.chmod(0o755)

    def start(self) -> SlurmCluster:
        self.write_config()
        self.write_clients()
        key = self.root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        r = self.root
        self.daemon(
            [
                "munged",
                "--force",
                f"--socket={r}/munge.sock",
                f"--key-file={key}",
                f"--log-file={r}/log/munged.log",
                f"--pid-file={r}/munged.pid",
                f"--seed-file={r}/munged.seed",
            ]
        )
        self.daemon(["slurmctld", "-i"])
        for node in NODES:
            self.daemon(["slurmd", "-N", node])
        self.wait_for_nodes()
        return self

    def daemon(self, argv: list[str]) -> None:
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}\n{self.logs()}")

    def wait_for_nodes(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            states = self.client("sinfo", "-h", "-N", "-o", "%N %T", check=False)
            if states and all(f"{node} idle" in states for node in NODES):
                return
            time.sleep(0.5)
        raise RuntimeError(f"the SLURM nodes did not come up: {states!r}\n{self.logs()}")

    # ---- use --------------------------------------------------------------------------------

    def client(self, *argv: str, check: bool = True) -> str:
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
        return done.stdout

    def sacct(self) -> dict[str, dict[str, str]]:
        """{job id: SACCT_FIELDS} of every finished job, as `sacct --completion` reads them from
        the controller's job completion log (a site's sacct reads its accounting database)."""
        out = self.client(
            "sacct", "--completion", "--allusers", "--starttime", "2000-01-01", "-n", "-P", "-o", ",".join(SACCT_FIELDS)
        )
        jobs = {}
        for line in out.splitlines():
            fields = dict(zip(SACCT_FIELDS, line.split("|", len(SACCT_FIELDS) - 1)))
            jobs[fields["JobID"]] = fields
        return jobs

    def logs(self) -> str:
        parts = []
        for log in sorted((self.root / "log").glob("*.log")):
            parts.append(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:]))
        return "\n".join(parts)

    # ---- tear-down --------------------------------------------------------------------------

    def stop(self) -> None:
        """Cancel every job, then stop the daemons by their pid files (TERM, then KILL)."""
        self.client("scancel", "--user", str(os.geteuid()), check=False)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and self.client("squeue", "-h", check=False).strip():
            time.sleep(0.5)
        pids = []
        for name in [*(f"slurmd-{n}.pid" for n in NODES), "slurmctld.pid", "munged.pid"]:
            path = self.root / name
            if path.exists() and path.read_text().strip().isdigit():
                pids.append(int(path.read_text().strip()))
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
            time.sleep(0.2)
        for pid in filter(_alive, pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


if __name__ == "__main__":
    why = unavailable()
    if why:
        sys.exit(why)
    cluster = SlurmCluster(Path(sys.argv[1]) if len(sys.argv) > 1 else None).start()
    print(f"export SLURM_CONF={cluster.conf}", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
