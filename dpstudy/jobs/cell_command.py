"""The command line that runs one cell's processes on this node, for dpstudy.jobs.launch: `python -m
dpstudy.engine` (single, dp; and a multi-node cell outside an allocation big enough, which runs
alone to record why it was skipped), `torchrun --standalone` (ddp, fsdp on one node), or inside a
SLURM allocation `srun torchrun --nnodes=N --rdzv-backend=c10d` with the rendezvous on the batch
host, where the launcher runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dpstudy.jobs import slurm
from dpstudy.study.spec import one_process_per_device
from dpstudy.util.ports import free_port

# The ranks run the engine as a module, so an installed (not editable) dpstudy works too.
TRAIN_MODULE = ("-m", "dpstudy.engine")
# torchrun's per-rank log folders, in the cell's folder (on every node: the shared file system)
# instead of a torchelastic_* folder in each node's /tmp that nothing removes; the launcher
# removes it when the cell's processes end.
TORCHRUN_LOGS = "torchrun-logs"


def torchrun(logs: Path) -> list[str]:
    """torchrun's agent, ended without the interpreter's teardown (dpstudy.jobs.torchrun), with its
    per-rank logs in `logs`: without --log-dir it leaves a torchelastic_* folder in /tmp."""
    return [sys.executable, "-m", "dpstudy.jobs.torchrun", f"--log-dir={logs}"]


def command(spec: dict, cell: str, out: Path, cores: int, allocation: slurm.Allocation | None) -> list[str]:
    """The command line that runs the cell's processes (see the module's docstring)."""
    train = [*TRAIN_MODULE, "--spec", json.dumps(spec, sort_keys=True), "--out", str(out), "--cell", cell]
    train += ["--cores", str(cores)]
    nodes, gpus = spec["nodes"], spec["gpus"]
    if not one_process_per_device(spec) or (nodes > 1 and (allocation is None or allocation.nodes < nodes)):
        return [sys.executable, *train]
    if nodes == 1:
        return [*torchrun(out / TORCHRUN_LOGS), "--standalone", f"--nproc-per-node={gpus}", *train]
    return [
        "srun",
        f"--nodes={nodes}",
        f"--ntasks={nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={cores}",
        "--kill-on-bad-exit=1",
        *torchrun(out / TORCHRUN_LOGS),
        f"--nnodes={nodes}",
        f"--nproc-per-node={gpus}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={allocation.head}:{free_port()}",
        f"--rdzv-id={allocation.job_id}",
        *train,
    ]
