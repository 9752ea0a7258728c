"""The Trainer: one cell's training loop and evaluation (shaped like pytorch/examples'
multigpu_torchrun), the same for every mode: what differs lives in the mode (dpstudy.engine.modes).
Running a cell around it (seeds, data, the record) is dpstudy.engine.cell's."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch
import torch.nn as nn

from dpstudy.engine import objective
from dpstudy.engine.compiling import COMPILE_OPTIONS, compiler_errors, timed_compile
from dpstudy.engine.compiling import eager as compiling_eager
from dpstudy.engine.heartbeat import BACKWARD, EVALUATING, FORWARD, LOADING, NoHeartbeat
from dpstudy.engine.modes import Mode
from dpstudy.engine.monitor import HostLoad, peak_memory_mb, peak_reserved_mb, reset_peaks
from dpstudy.engine.reference import InCell

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def no_fault(epoch: int, step: int) -> None:
    pass


class SteadyWindow:
    """What throughput is measured over: every training step after the run's first `warmup_steps`
    (allocator, caches, lazy initialisation), whichever epoch they fall in, less the steps that
    compiled a graph (see dpstudy.engine.compiling.timed_compile)."""

    def __init__(self, warmup_steps: int):
        self.warmup_steps, self.steps_done = warmup_steps, 0

    def open_epoch(self, start: float) -> None:
        self.start = start if self.steps_done >= self.warmup_steps else None
        self.from_sample, self.uncounted_s, self.uncounted_samples = 0, 0.0, 0

    def after_step(self, samples: int, batch: int, compile_s: float, synchronize) -> None:
        """`samples`: the epoch's so far, this step's `batch` included."""
        if compile_s and self.start is not None:  # e.g. the epoch's smaller last batch compiled
            self.uncounted_s, self.uncounted_samples = self.uncounted_s + compile_s, self.uncounted_samples + batch
        self.steps_done += 1
        if self.start is None and self.steps_done == self.warmup_steps:
            synchronize()  # the warm-up's last step has finished on the device
            self.start, self.from_sample = time.perf_counter(), samples

    def seconds(self, end: float) -> float:
        return end - self.start - self.uncounted_s if self.start is not None else 0.0

    def samples(self, samples: int) -> int:
        return samples - self.from_sample - self.uncounted_samples if self.start is not None else 0


class Trainer:
    def __init__(
        self,
        spec: dict,
        mode: Mode,
        train_data,
        test_data,
        model: nn.Module,
        log=print,
        build_replica: Callable[[], nn.Module] | None = None,
        fault=no_fault,
        heartbeat=None,
    ):
        """`build_replica` makes another model like `model` on its device (dpstudy.engine.probe's
        FSDP probe times an unsharded one); `fault(epoch, step)` is called before each step (tests
        inject failures); `heartbeat` (dpstudy.engine.heartbeat) hears of every phase of every step."""
        self.spec, self.mode, self.log = spec, mode, log
        self.train_data, self.test_data = train_data, test_data
        self.amp_dtype = AMP_DTYPES.get(spec["precision"])
        self.compiled = bool(spec.get("compile", False))
        self.model = mode.prepare(model, self.amp_dtype, self.compiled)
        # compiled with the model, the loss is fused: a language model's fp32 copy of its logits
        # (batch x seq_len x vocab) is never made whole, as torchtitan compiles its loss too
        self.loss = torch.compile(objective.loss, **COMPILE_OPTIONS) if self.compiled else objective.loss
        self.build_replica = build_replica
        self.scaler = torch.amp.GradScaler(mode.device.type, enabled=spec["precision"] == "fp16")
        # the model as its steps train it and their optimizer: a ZeRO engine owns both
        self.model, self.optimizer = mode.optimizer(self.model, spec, self.amp_dtype)
        self.fault = fault
        self.heartbeat = heartbeat or NoHeartbeat()
        self.window = SteadyWindow(spec["warmup_steps"])
        self.host = HostLoad()
        self.gauge = InCell(mode.device)
        self.sample: torch.Tensor | None = None  # one training input, for evaluate's extra forwards

    def autocast(self):
        return self.mode.autocast(self.amp_dtype)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One training step: forward, backward and the optimizer's step, each as the mode runs it."""
        self.mode.zero_grad(self.optimizer)
        with compiler_errors(self.compiled):  # forward and backward both compile lazily
            with self.autocast():
                logits = self.model(x)
                loss = self.loss(logits, y)
            self.heartbeat.beat(BACKWARD)  # where DDP and FSDP wait for their peers
            self.mode.backward(loss, self.scaler)
        self.mode.optimizer_step(self.optimizer, self.scaler)
        return loss.detach() * len(y), objective.correct(logits.detach(), y)

    def train_epoch(self, epoch: int) -> dict:
        self.model.train()
        self.train_data.set_epoch(epoch)
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.mode.device)
        correct = torch.zeros((), dtype=torch.float64, device=self.mode.device)
        data_wait, steps, samples, compile_s = 0.0, 0, 0, 0.0
        self.mode.synchronize()
        load_start = self.host.mark()
        start = time.perf_counter()
        self.window.open_epoch(start)
        batches = iter(self.train_data)
        self.heartbeat.epoch(epoch, len(self.train_data))
        while True:
            self.heartbeat.beat(LOADING, steps + 1)
            before = time.perf_counter()
            try:
                x, y = next(batches)
            except StopIteration:
                break
            data_wait += time.perf_counter() - before
            steps += 1
            if self.sample is None:
                self.sample = x[:1]
            self.heartbeat.beat(FORWARD)
            self.fault(epoch, steps)
            with timed_compile(self.compiled, self.mode) as compiling:
                batch_loss, batch_correct = self.step(x, y)
            compile_s += compiling.seconds
            loss_sum += batch_loss  # device-side sums: no host sync inside the epoch
            correct += batch_correct
            samples += len(y)
            self.window.after_step(samples, len(y), compiling.seconds, self.mode.synchronize)
        self.mode.synchronize()
        end = time.perf_counter()
        machine, own = HostLoad.cores(load_start, self.host.mark())
        wall = end - start
        counts = [float(samples), float(self.window.samples(samples)), machine / self.mode.local_world_size, own]
        # summed over ranks: per node, then ours
        totals = torch.tensor([0.0, 0.0, *counts], dtype=torch.float64, device=loss_sum.device)
        totals[0], totals[1] = loss_sum, correct
        loss_sum, correct, samples, steady_samples, machine, own = self.mode.all_reduce_sum(self.comm(totals)).tolist()
        compiled = {"compile_s": compile_s} if self.compiled else {}
        return {
            **compiled,
            "train_loss": loss_sum / samples,
            "train_acc": correct / samples,
            "wall_s": wall,
            "data_wait_s": data_wait,
            "compute_s": wall - data_wait,
            "samples": int(samples),
            "samples_per_s": samples / wall,
            "steady_s": self.window.seconds(end),
            "steady_samples": int(steady_samples),
            # cores the rest of each node used meanwhile (other jobs, steal), averaged over nodes
            "other_load": max(0.0, (machine - own) / self.spec["nodes"]),
        }

    def evaluate(self) -> dict:
        """The whole test set exactly once: ranks take disjoint shards, sums are all-reduced. A
        compiled model is evaluated eagerly (compiling.eager): the same function, no eval-mode
        graphs to compile, and evaluation is never part of the throughput."""
        self.heartbeat.beat(EVALUATING)
        with compiling_eager(self.compiled), torch.no_grad():
            return self.evaluate_once()

    def evaluate_once(self) -> dict:
        model = self.mode.eval_model(self.model)
        self.mode.sync_buffers(model)
        model.eval()
        totals = torch.zeros(3, dtype=torch.float64, device=self.mode.device)
        self.mode.synchronize()
        start = time.perf_counter()
        missing = self.mode.missing_forwards(len(self.test_data))
        compile_s = 0.0
        for x, y in self.test_data:
            with timed_compile(self.compiled, self.mode) as compiling, compiler_errors(self.compiled), self.autocast():
                logits = model(x)  # eagerly (see evaluate): no graph compiles here, eval_compile_s stays 0
            compile_s += compiling.seconds
            totals += torch.stack(
                [
                    objective.loss_sum(logits, y).double(),
                    objective.correct(logits, y),
                    torch.tensor(len(y), device=totals.device, dtype=torch.float64),
                ]
            )
        for _ in range(missing):  # eval mode, outputs discarded: every test image counts once
            model(self.sample)
        self.mode.synchronize()
        seconds = time.perf_counter() - start
        loss_sum, correct, samples = self.mode.all_reduce_sum(self.comm(totals)).tolist()
        compiled = {"eval_compile_s": compile_s} if self.compiled else {}
        return {"test_loss": loss_sum / samples, "test_acc": correct / samples, "eval_s": seconds, **compiled}

    def machine_rates(self) -> dict[str, float]:
        """The machine's speed right after the epoch (dpstudy.engine.reference.InCell), outside its
        timed steps and its peaks: every rank's gauge at once, their mean. The cells' noise can then
        be set against the machine's at the same moments, not only against the floor's own job."""
        rates = self.gauge.rates()  # the same parts on every rank: one kind of device per cell
        values = torch.tensor(list(rates.values()), dtype=torch.float64, device=self.mode.device)
        total = self.mode.all_reduce_sum(self.comm(values)).tolist()
        return {name: value / self.mode.world_size for name, value in zip(rates, total, strict=True)}

    def comm(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.mode.comm_device())

    def run(self, on_epoch) -> str | None:
        """Train every epoch, or up to the first with a loss that is not finite (stop_on_divergence:
        the train loss is all-reduced, so every rank stops at the same epoch); returns why it
        stopped early, else None."""
        devices, epochs = self.mode.devices(), self.spec["epochs"]
        for epoch in range(1, epochs + 1):
            reset_peaks(devices)
            result = {"epoch": epoch, **self.train_epoch(epoch), **self.evaluate()}
            result["peak_mem_mb"] = self.mode.all_gather_floats(peak_memory_mb(devices))
            if devices:
                result["peak_reserved_mb"] = self.mode.all_gather_floats(peak_reserved_mb(devices))
            result.update(self.machine_rates())
            on_epoch(result)
            self.log(progress_line(result, epochs))
            if self.spec["stop_on_divergence"] and not math.isfinite(result["train_loss"]) and epoch < epochs:
                why = (
                    f"training loss became {result['train_loss']} in epoch {epoch}: the remaining "
                    f"{epochs - epoch} of {epochs} epochs were not run (stop_on_divergence)"
                )
                self.log(f"[dpstudy] {why}")
                return why
        return None


def progress_line(e: dict, epochs: int) -> str:
    return (
        f"epoch {e['epoch']}/{epochs} train_loss {e['train_loss']:.4f} train_acc {e['train_acc']:.2%} "
        f"test_loss {e['test_loss']:.4f} test_acc {e['test_acc']:.2%} wall {e['wall_s']:.2f}s "
        f"data_wait {e['data_wait_s']:.2f}s {e['samples_per_s']:.0f} samples/s"
    )
