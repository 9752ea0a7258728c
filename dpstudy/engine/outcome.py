"""How a run ends: the record, written once, and the stop of every rank when one faults.

The ok path is rank 0's. When a rank faults (out of memory, or anything unexpected) the other
ranks are typically blocked inside a collective that will never complete, so the faulting rank
writes the record itself (every rank holds the same all-reduced history), then drops a fault
marker; a watchdog thread on every other rank sees it and ends that process with the agreed
exit code. No rank waits on a collective timeout. A rank whose collective failed because a peer
died or stopped answering blames that peer, read off the ranks' heartbeats
(dpstudy.engine.heartbeat), not itself.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
import traceback
from pathlib import Path

import torch

from dpstudy.engine import heartbeat
from dpstudy.record import fields as record
from dpstudy.record import learning
from dpstudy.record.envinfo import fallback_environment
from dpstudy.study.resources import processes_per_node
from dpstudy.util.atomic import write_json

FAULT_FILE = ".fault.json"
EXIT_CODES = {"ok": 0, "skipped": 0, "oom": 0, "failed": 1}


def is_oom(error: BaseException) -> bool:
    # CPU allocators raise a plain RuntimeError; CUDA raises torch.OutOfMemoryError.
    return isinstance(error, torch.OutOfMemoryError) or "can't allocate memory" in str(error)


def summarise(error: BaseException) -> str:
    frame = traceback.extract_tb(error.__traceback__)[-1:] or [None]
    where = f" (at {Path(frame[0].filename).name}:{frame[0].lineno})" if frame[0] else ""
    return f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}{where}"


def steady_throughput(epochs: list[dict]) -> float:
    """Samples per second over the steady window: every step after the run's warm-up steps, in
    whichever epoch (dpstudy.engine.train). A run too short to leave the warm-up falls back to the
    epochs after the first, or the only one."""
    samples, seconds = sum(e.get("steady_samples", 0) for e in epochs), sum(e.get("steady_s", 0.0) for e in epochs)
    if samples > 0 and seconds > 0:
        return samples / seconds
    steady = epochs[1:] or epochs  # compile: true: its compiling steps' time left out here too
    return sum(e["samples"] for e in steady) / sum(e["wall_s"] - e.get("compile_s", 0.0) for e in steady)


class Outcome:
    def __init__(self, out_dir: str | Path, cell: str, spec: dict, t0: float):
        self.out_dir = Path(out_dir)
        self.record_path = self.out_dir / "record.json"
        self.fault_path = self.out_dir / FAULT_FILE
        self.cell, self.spec, self.t0 = cell, spec, t0
        self.env: dict | None = None  # the rank's (envinfo.environment), once the engine measured it
        self.epochs: list[dict] = []
        self.util: dict | None = None
        self.probe: dict | None = None
        self.memory: dict | None = None
        self.trace: dict | None = None  # the traced steps' figures (dpstudy.engine.tracing)
        self.startup_s: float | None = None
        self.classes: int | None = None  # of the data, and its test images: the learning verdict's chance
        self.test_samples = 0
        self.chance_loss: float | None = None  # text: the unigram entropy, the loss of guessing by frequency
        self.cost: dict | None = None  # what a sample costs (dpstudy.engine.cost), rank 0's
        self.stopped_early: str | None = None  # why training ended before its last epoch (Trainer.run)
        self._lock = threading.Lock()
        self._done = False

    def learning_basis(self, task, meta: dict) -> None:
        """What the learning verdict compares the run with: chance accuracy over the classes of an
        image task, or the loss of predicting a text's tokens by their frequency alone."""
        if task.is_text:
            self.chance_loss = meta.get("unigram_entropy_nats")
            return
        self.classes = task.classes
        self.test_samples = meta.get("splits", {}).get("test", {}).get("n", 0)

    def clear_previous(self) -> None:
        """Before anything runs: an old record or fault marker must not stand for this run."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.record_path.unlink(missing_ok=True)
        self.fault_path.unlink(missing_ok=True)
        for old in heartbeat.folder(self.out_dir).glob("rank*"):
            old.unlink(missing_ok=True)

    def write(self, status: str, reason: str | None = None) -> None:
        with self._lock:
            if self._done:
                return
            record.write(self.record_path, self.as_record(status, reason))
            self._done = True

    def as_record(self, status: str, reason: str | None) -> dict:
        summary = {"total_s": time.time() - self.t0, "startup_s": self.startup_s}
        if self.epochs:
            steady = self.epochs[1:] or self.epochs  # epoch 1 is warm-up
            summary["median_epoch_s"] = statistics.median(e["wall_s"] for e in steady)
            summary["samples_per_s"] = steady_throughput(self.epochs)
            summary["final_test_acc"] = self.epochs[-1]["test_acc"]
            if (self.classes or self.chance_loss) and status == "ok":  # a cell that failed says so already
                summary["learned"], summary["learned_reason"] = learning.verdict(
                    self.epochs, self.classes or 0, self.test_samples, self.chance_loss
                )
        if self.stopped_early:
            summary["stopped_early"] = self.stopped_early
        if self.spec.get("compile"):  # the steps and evaluation batches that compiled, never in samples_per_s
            summary["compile_s"] = sum(e.get("compile_s", 0.0) + e.get("eval_compile_s", 0.0) for e in self.epochs)
        nodes = self.spec["nodes"]
        env = self.env if self.env is not None else fallback_environment(processes_per_node(self.spec) * nodes, nodes)
        return record.make(
            self.cell,
            status,
            reason,
            self.spec,
            env,
            self.epochs,
            summary,
            self.util,
            self.probe,
            self.memory,
            self.cost,
            self.trace,
        )

    # ---- faults ----------------------------------------------------------------------------

    def fault(self, error: BaseException, rank: int, world_size: int) -> int:
        """Record a fault (unless another rank's fault caused this one) and return the exit code."""
        if world_size > 1:
            other = self.wait_for_fault(timeout_s=3.0)
            if other is not None and other["rank"] != rank:
                return other["exit_code"]  # we only saw the consequence of another rank's fault
        status = "oom" if is_oom(error) else "failed"
        reason = f"rank {rank}: {summarise(error)}"
        peer = heartbeat.culprit(heartbeat.read(self.out_dir), rank) if world_size > 1 and status == "failed" else None
        if peer:  # this rank only saw the consequence
            reason = f"{peer}; then {reason}"
        if status == "failed":
            traceback.print_exception(error)
        print(f"[dpstudy] {status}: {reason}", flush=True)
        self.write(status, reason)
        if world_size > 1:
            write_json(self.fault_path, {"rank": rank, "status": status, "exit_code": EXIT_CODES[status]})
        return EXIT_CODES[status]

    def wait_for_fault(self, timeout_s: float) -> dict | None:
        deadline = time.time() + timeout_s
        while True:
            if self.fault_path.exists():
                return json.loads(self.fault_path.read_text())
            if time.time() >= deadline:
                return None
            time.sleep(0.05)

    def watch(self, rank: int, interval_s: float = 0.2) -> None:
        """On this rank, exit as soon as another rank reports a fault."""

        def run() -> None:
            while True:
                time.sleep(interval_s)
                if self.fault_path.exists():
                    fault = json.loads(self.fault_path.read_text())
                    if fault["rank"] != rank:
                        print(
                            f"[dpstudy] rank {rank}: stopping, rank {fault['rank']} reported {fault['status']}",
                            flush=True,
                        )
                        os._exit(fault["exit_code"])

        threading.Thread(target=run, name="fault-watch", daemon=True).start()
