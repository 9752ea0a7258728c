"""Item 10 of `make gpu-check`: a trace of a two-rank Gloo DDP cell on one GPU, reduced from its CUDA
kernels (dpstudy.engine.tracing, dpstudy.engine.trace_figures).

NCCL runs one rank per GPU, so two ranks on one GPU need Gloo, which stages each all-reduce through
host memory. Both ranks drive cuda:0. The cell is the default study's LeNet on synthetic, DDP at
global batch 256. Each rank is built as dpstudy.engine.cell builds one, but on the shared GPU: the
DDP mode, the device loader and the Trainer. It trains a warm-up epoch, then traces STEPS steps with
the cell's own capture. On a CPU (the unit tests) the same runs with device cpu.

Figures: what the reduction read compute from (`cuda`: the kernels), the traced step and its parts,
that they add up to the step, the collectives' calls and bytes per step, and the trace files kept.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

STEPS = 8
BATCH = 256  # global: 128 a rank
SAMPLES = (8000, 2000)  # the default study's synthetic


def spec(device: str) -> dict:
    from dpstudy.study.spec import complete

    return complete(
        {
            "dataset": "synthetic",
            "model": "lenet",
            "mode": "ddp",
            "gpus": 2,
            "backend": "gloo",
            "batch": BATCH,
            "device": device,
            "epochs": 1,
            "loader": "device",
            "trace_steps": STEPS,
        }
    )


def rank_main(device: str, data_root: str, out: str) -> None:
    """One rank (torchrun starts two): train an epoch on the shared device, then trace."""
    import torch

    from dpstudy import models
    from dpstudy.data import store
    from dpstudy.data.task import Task
    from dpstudy.engine import tracing
    from dpstudy.engine.loaders import make_loader
    from dpstudy.engine.modes.ddp import DistributedDataParallel
    from dpstudy.engine.train import Trainer

    cell = {**spec(device), "data_root": data_root}
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    mode = DistributedDataParallel(
        torch.device(device, 0) if device == "cuda" else torch.device("cpu"),
        gpus=2,
        backend="gloo",
        rank=rank,
        world_size=world,
        local_rank=rank,
        local_world_size=world,
    )
    mode.start()
    meta = store.load_meta("synthetic", data_root)
    task = Task.image(meta["shape"][0], meta["shape"][1], len(meta["classes"]))
    images = {"augment": "none", "mean": meta["mean"], "std": meta["std"], "channels_last": False}
    common = {"batch": BATCH // world, "partition": mode.partition, "seed": 0, "device": mode.device, "workers": 0}
    train = make_loader("device", *store.load_split("synthetic", data_root, "train"), train=True, **common, **images)
    torch.manual_seed(0)
    model = models.build("lenet", task, {}).to(mode.device)
    trainer = Trainer(cell, mode, train, None, model, log=lambda line: None)
    trainer.train_epoch(1)
    trace = tracing.capture(trainer, out)
    if mode.is_main:
        Path(out, "trace.json").write_text(json.dumps(trace))
    mode.close()


def trace_result(trace: dict) -> dict:
    """The registry's figures from the capture's `trace` (pure: the unit tests check it on a CPU's)."""
    pace = trace["ranks"][trace["pace_rank"]] if trace.get("pace_rank") is not None else {}
    parts = [trace.get(k) for k in ("data_wait_s", "compute_s", "exposed_comm_s", "idle_s")]
    add_up = None not in parts and abs(sum(parts) - trace["step_s"]) <= 1e-9 * max(trace["step_s"], 1)
    all_reduce = (trace.get("collectives") or {}).get("all_reduce") or {}
    return {
        "figures": {
            "from_kernels": pace.get("activity") == "cuda",
            "parts_add_up": bool(add_up),
            "files_kept": all(r.get("file") for r in trace["ranks"]) and len(trace["ranks"]) == 2,
            "step_ms": trace["step_s"] * 1e3 if trace.get("step_s") is not None else None,
            "compute_ms": trace["compute_s"] * 1e3 if trace.get("compute_s") is not None else None,
            "exposed_comm_ms": trace["exposed_comm_s"] * 1e3 if trace.get("exposed_comm_s") is not None else None,
            "overlap": trace.get("overlap"),
            "all_reduce_calls": all_reduce.get("calls"),
            "all_reduce_mb": all_reduce["bytes"] / 1e6 if all_reduce.get("bytes") is not None else None,
        },
        "details": {"reason": trace.get("reason") or ""},
        "data": trace,
    }


def measure(out: Path, device: str = "cuda", samples: tuple[int, int] = SAMPLES) -> dict:
    """The two ranks under torchrun, on `device` (`samples`: train and test; the tests' are fewer);
    their trace's figures."""
    from dpstudy.data import store
    from dpstudy.jobs import cell_command

    out = Path(out)
    data_root = out / "data"
    store.prepare("synthetic", data_root, {"train_size": samples[0], "test_size": samples[1]})
    cell = out / "cell"
    cell.mkdir(parents=True, exist_ok=True)
    command = [*cell_command.torchrun(out / cell_command.TORCHRUN_LOGS), "--standalone", "--nproc-per-node=2"]
    command += ["-m", "dpstudy.gpucheck.trace", device, str(data_root), str(cell)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"the two ranks failed: {proc.stderr[-2000:]}")
    return trace_result(json.loads((cell / "trace.json").read_text()))


def run_trace(out: Path) -> dict:
    result = measure(Path(out) / "trace")
    result["notes"] = [
        "lenet / synthetic, DDP over Gloo on two ranks sharing cuda:0, global batch 256, "
        f"{STEPS} traced steps after a warm-up epoch; the figures are the median step's, the pace-setting rank's"
    ]
    return result


if __name__ == "__main__":
    from dpstudy.util.quick_exit import finish

    finish(rank_main(*sys.argv[1:4]))  # its trace is written: skip the teardown (dpstudy.util.quick_exit)
