"""After training: a torch.profiler trace of a few training steps of the cell, on every rank,
reduced where it was taken (dpstudy.engine.trace_figures) and kept beside the record.

The steps are the cell's own (Trainer.step: forward, backward, the optimizer's step), after the
timed epochs, the evaluation and the probe, so that no timed figure moves. Each step is one
`dpstudy:step` span with its batch's `dpstudy:data` span inside, and ends with a device
synchronize: a step's kernels end inside it. CPU activity always, CUDA's on a GPU; record_shapes,
so that each collective's span carries its tensor's size.

Every rank keeps its trace as compressed Chrome-trace JSON (trace/rank{R}.json.gz in the cell's
folder: Perfetto and TensorBoard open it), written atomically; when the cell's traces together pass
MAX_BYTES every rank removes its own and only the figures stay, with the reason. A trace that
cannot be made or written (a full disk, a path too long) leaves the record and its timings as they
are, with `trace.reason` saying why.
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import shutil
import tempfile
from pathlib import Path

from dpstudy.engine.trace_figures import DATA, STEP, reduce
from dpstudy.util.atomic import atomic_output

DEFAULT_STEPS = 8  # trace_steps null: a multi-device cell's steps (a single-device cell's: none)
MAX_BYTES = 20 * 2**20  # the cell's compressed traces, every rank's together
FOLDER = "trace"
# the figures a cell's record summarises, the pace-setting rank's (see summary)
SUMMARY = ("step_s", "data_wait_s", "compute_s", "exposed_comm_s", "idle_s", "comm_s", "step_spread_s", "overlap")
SUMMARY += ("collectives",)


def steps_of(spec: dict) -> int:
    """The steps to trace: trace_steps, or with it null DEFAULT_STEPS on more than one device."""
    asked = spec.get("trace_steps")
    if asked is not None:
        return int(asked)
    return DEFAULT_STEPS if spec["gpus"] * spec["nodes"] > 1 else 0


def capture(trainer, out_dir: str | Path) -> dict | None:
    """The record's `trace` (None when the cell traces no step); collective: every rank calls it."""
    steps = steps_of(trainer.spec)
    if steps == 0:
        return None
    mode = trainer.mode
    mine = {"rank": mode.rank, "file": None, "bytes": None, "reason": None}
    folder = tempfile.mkdtemp(prefix="dpstudy-trace-")
    try:
        mine.update(reduced_and_kept(trainer, steps, os.path.join(folder, "trace.json"), out_dir))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    ranks = mode.all_gather_objects(mine)
    total = sum(r["bytes"] or 0 for r in ranks)
    if total > MAX_BYTES:  # past the bound: the figures stay, the files go
        if mine["file"]:
            Path(out_dir, mine["file"]).unlink(missing_ok=True)
        for r in ranks:
            r["file"] = None
        why = f"the cell's traces took {total / 2**20:.1f} MiB, past the bound of {MAX_BYTES / 2**20:.0f} MiB"
        why += ": figures only"
        ranks = [{**r, "reason": r["reason"] or why} for r in ranks]
    return summary(steps, ranks)


def reduced_and_kept(trainer, steps: int, raw: str, out_dir) -> dict:
    """This rank's figures, its file and bytes, and why one is missing (`reason`)."""
    rank = trainer.mode.rank
    try:
        events = traced_steps(trainer, steps, raw)
    except (OSError, RuntimeError) as error:  # the profiler's start or its export
        return {"reason": f"rank {rank}: no trace: {error}"}
    found: dict = {}
    try:
        found.update(reduce(events))
    except ValueError as error:
        found["reason"] = f"rank {rank}: {error}"
    try:
        relative = f"{FOLDER}/rank{rank}.json.gz"
        found["bytes"] = keep(raw, Path(out_dir) / relative)
        found["file"] = relative
    except OSError as error:
        found["reason"] = found.get("reason") or f"rank {rank}: the trace was not written: {error}"
    return found


def summary(steps: int, ranks: list[dict]) -> dict:
    """The record's trace: every rank's figures, and the pace-setting rank's as the cell's. Ranks
    meet at every collective, so the rank that computed longest sets the step; the others' exposed
    communication holds their wait for it (load imbalance), its own is the communication's."""
    reduced = [r for r in ranks if "step_s" in r]
    pace = max(reduced, key=lambda r: r["compute_s"]) if reduced else None
    reasons = sorted({r["reason"] for r in ranks if r["reason"]})
    return {
        "steps": steps,
        "pace_rank": pace["rank"] if pace else None,
        **{key: (pace[key] if pace else None) for key in SUMMARY},
        "reason": "; ".join(reasons) or None,
        "ranks": ranks,
    }


def traced_steps(trainer, steps: int, raw: str) -> list[dict]:
    """The Chrome-trace events of `steps` training steps, exported to `raw` (one untraced step
    first: the first after evaluation and the probe warms the caches again)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    mode = trainer.mode
    on_gpu = mode.device.type == "cuda"
    if not on_gpu:  # Kineto logs on every use, and an ERROR that it finds no GPU: not the user's news
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    trainer.model.train()
    trainer.train_data.set_epoch(trainer.spec["epochs"] + 2)  # the probe's is epochs + 1
    batches = itertools.cycle(list(itertools.islice(iter(trainer.train_data), steps + 1)))
    trainer.step(*next(batches))
    mode.synchronize()
    with profile(activities=activities, record_shapes=True) as prof:
        for _ in range(steps):
            with record_function(STEP):
                with record_function(DATA):
                    x, y = next(batches)
                trainer.step(x, y)
                mode.synchronize()
    trainer.mode.zero_grad(trainer.optimizer)
    prof.export_chrome_trace(raw)
    with open(raw) as f:
        return json.load(f)["traceEvents"]


def keep(raw: str, path: Path) -> int:
    """The exported trace `raw` gzip-compressed at `path`, written atomically; its bytes."""
    with open(raw, "rb") as source, atomic_output(path) as tmp, gzip.open(tmp, "wb", compresslevel=3) as f:
        shutil.copyfileobj(source, f, 2**20)
    return path.stat().st_size
