"""Train one cell: the Trainer (shaped like pytorch/examples' multigpu_torchrun) and `run`."""

from __future__ import annotations

import contextlib
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from dpstudy import models
from dpstudy.data import store as data
from dpstudy.engine import memory, probe
from dpstudy.engine.compiling import compile_after_wrap, compile_before_wrap, compiler_errors, timed_compile
from dpstudy.engine.compiling import eager as compiling_eager
from dpstudy.engine.loaders import make_loader
from dpstudy.engine.monitor import HostLoad, UtilSampler, peak_memory_mb, reset_peaks
from dpstudy.engine.outcome import Outcome
from dpstudy.engine.parallel import Parallel, Skip, pin_to_cores, plan, resolve_device, threads_per_process
from dpstudy.ext.loader import check_kernels
from dpstudy.record.envinfo import environment, rank_host
from dpstudy.study import spec as specs

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Trainer:
    def __init__(self, spec: dict, par: Parallel, train_data, test_data, model: nn.Module, log=print):
        self.spec, self.par, self.log = spec, par, log
        self.train_data, self.test_data = train_data, test_data
        self.amp_dtype = AMP_DTYPES.get(spec["precision"])
        self.compiled = bool(spec.get("compile", False))
        if self.compiled:
            model = compile_before_wrap(model, par)
        # FSDP casts through its mixed-precision policy; the other modes through autocast
        self.model = par.wrap(model, self.amp_dtype if par.mode == "fsdp" else None)
        if self.compiled:
            self.model = compile_after_wrap(self.model, par)
        params = self.model.parameters()
        lr = specs.scaled_lr(spec)
        self.optimizer = (
            torch.optim.SGD(params, lr=lr, momentum=spec["momentum"], weight_decay=spec["weight_decay"])
            if spec["optimizer"] == "sgd"
            else torch.optim.Adam(params, lr=lr, weight_decay=spec["weight_decay"])
        )
        self.scaler = torch.amp.GradScaler(par.device.type, enabled=spec["precision"] == "fp16")
        self.fault = injected_fault(par.rank)
        # The steady window: every training step after the first `warmup_steps` of the run
        # (allocator, caches, lazy initialisation), whichever epoch they fall in.
        self.warmup_steps, self.steps_done = spec["warmup_steps"], 0
        self.host = HostLoad()
        self.sample: torch.Tensor | None = None  # one training input, for evaluate's extra forwards

    def autocast(self):
        if self.amp_dtype is None or self.par.mode == "fsdp":
            return contextlib.nullcontext()
        return torch.autocast(self.par.device.type, dtype=self.amp_dtype)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.optimizer.zero_grad(set_to_none=True)
        with compiler_errors(self.compiled):  # forward and backward both compile lazily
            with self.autocast():
                logits = self.model(x)
                loss = F.cross_entropy(logits.float(), y)  # FSDP's bf16/fp16 logits: the loss in fp32
            self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return loss.detach() * len(y), (logits.argmax(1) == y).sum()

    def train_epoch(self, epoch: int) -> dict:
        self.model.train()
        self.train_data.set_epoch(epoch)
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.par.device)
        correct = torch.zeros((), dtype=torch.int64, device=self.par.device)
        data_wait, steps, samples = 0.0, 0, 0
        compile_s, uncounted_s, uncounted_samples = 0.0, 0.0, 0  # steps that compiled (see timed_compile)
        self.par.synchronize()
        load_start = self.host.mark()
        start = time.perf_counter()
        steady_start, steady_from = (start, 0) if self.steps_done >= self.warmup_steps else (None, 0)
        batches = iter(self.train_data)
        while True:
            before = time.perf_counter()
            try:
                x, y = next(batches)
            except StopIteration:
                break
            data_wait += time.perf_counter() - before
            steps += 1
            if self.sample is None:
                self.sample = x[:1]
            self.fault(epoch, steps)
            with timed_compile(self.compiled, self.par) as compiling:
                batch_loss, batch_correct = self.step(x, y)
            if compiling.seconds:  # a (re)compile, e.g. the epoch's smaller last batch: out of the steady window
                compile_s += compiling.seconds
                if steady_start is not None:
                    uncounted_s, uncounted_samples = uncounted_s + compiling.seconds, uncounted_samples + len(y)
            loss_sum += batch_loss  # device-side sums: no host sync inside the epoch
            correct += batch_correct
            samples += len(y)
            self.steps_done += 1
            if steady_start is None and self.steps_done == self.warmup_steps:
                self.par.synchronize()  # the warm-up's last step has finished on the device
                steady_start, steady_from = time.perf_counter(), samples
        self.par.synchronize()
        end = time.perf_counter()
        machine, own = HostLoad.cores(load_start, self.host.mark())
        wall = end - start
        steady_s = end - steady_start - uncounted_s if steady_start is not None else 0.0
        counts = [
            float(samples),
            float(samples - steady_from - uncounted_samples if steady_start is not None else 0),
            machine / self.par.local_world_size,
            own,
        ]  # summed over ranks: per node, then ours
        totals = torch.tensor([0.0, 0.0, *counts], dtype=torch.float64, device=loss_sum.device)
        totals[0], totals[1] = loss_sum, correct.double()
        loss_sum, correct, samples, steady_samples, machine, own = self.par.all_reduce_sum(self.comm(totals)).tolist()
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
            "steady_s": steady_s,
            "steady_samples": int(steady_samples),
            # cores the rest of each node used meanwhile (other jobs, steal), averaged over nodes
            "other_load": max(0.0, (machine - own) / self.spec["nodes"]),
        }

    def evaluate(self) -> dict:
        """The whole test set exactly once: ranks take disjoint shards, sums are all-reduced. A
        compiled model is evaluated eagerly (compiling.eager): the same function, no eval-mode
        graphs to compile, and evaluation is never part of the throughput."""
        with compiling_eager(self.compiled), torch.no_grad():
            return self.evaluate_once()

    def evaluate_once(self) -> dict:
        # ddp evaluates its plain module: DDP's forward is not for evaluation
        wrapped = getattr(self.model, "_orig_mod", self.model) if self.par.mode == "ddp" else self.model
        module = (
            wrapped.module if isinstance(wrapped, (nn.DataParallel, nn.parallel.DistributedDataParallel)) else wrapped
        )
        self.par.sync_buffers(module)
        model = self.model if self.par.mode == "dp" else module
        model.eval()
        totals = torch.zeros(3, dtype=torch.float64, device=self.par.device)
        self.par.synchronize()
        start = time.perf_counter()
        missing = self.par.missing_forwards(len(self.test_data))
        compile_s = 0.0
        for x, y in self.test_data:
            with timed_compile(self.compiled, self.par) as compiling, compiler_errors(self.compiled), self.autocast():
                logits = model(x)  # eagerly (see evaluate): no graph compiles here, eval_compile_s stays 0
            compile_s += compiling.seconds
            loss = F.cross_entropy(logits.float(), y, reduction="sum")
            totals += torch.stack(
                [
                    loss.double(),
                    (logits.argmax(1) == y).sum().double(),
                    torch.tensor(len(y), device=totals.device, dtype=torch.float64),
                ]
            )
        for _ in range(missing):  # outputs discarded: every test image counts once
            model(self.sample)
        self.par.synchronize()
        seconds = time.perf_counter() - start
        loss_sum, correct, samples = self.par.all_reduce_sum(self.comm(totals)).tolist()
        compiled = {"eval_compile_s": compile_s} if self.compiled else {}
        return {"test_loss": loss_sum / samples, "test_acc": correct / samples, "eval_s": seconds, **compiled}

    def comm(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.par.comm_device())

    def run(self, on_epoch) -> None:
        devices = self.par.devices()
        for epoch in range(1, self.spec["epochs"] + 1):
            reset_peaks(devices)
            result = {"epoch": epoch, **self.train_epoch(epoch), **self.evaluate()}
            result["peak_mem_mb"] = self.par.all_gather_floats(peak_memory_mb(devices))
            on_epoch(result)
            self.log(progress_line(result, self.spec["epochs"]))


def progress_line(e: dict, epochs: int) -> str:
    return (
        f"epoch {e['epoch']}/{epochs} train_loss {e['train_loss']:.4f} train_acc {e['train_acc']:.2%} "
        f"test_loss {e['test_loss']:.4f} test_acc {e['test_acc']:.2%} wall {e['wall_s']:.2f}s "
        f"data_wait {e['data_wait_s']:.2f}s {e['samples_per_s']:.0f} samples/s"
    )


def injected_fault(rank: int):
    """Tests make one rank fail on purpose: DPSTUDY_INJECT_FAULT='oom|error:RANK:EPOCH:STEP'."""
    setting = os.environ.get("DPSTUDY_INJECT_FAULT")
    if not setting:
        return lambda epoch, step: None
    kind, at_rank, at_epoch, at_step = setting.split(":")

    def maybe_raise(epoch: int, step: int) -> None:
        if (rank, epoch, step) == (int(at_rank), int(at_epoch), int(at_step)):
            if kind == "oom":
                raise torch.OutOfMemoryError(f"injected out-of-memory on rank {rank}")
            raise RuntimeError(f"injected error on rank {rank}")

    return maybe_raise


def load_datasets(spec: dict, par: Parallel):
    root, name = spec["data_root"], spec["dataset"]
    if not data.is_ready(name, root):
        if name not in data.DATASETS or not data.DATASETS[name].generated:  # downloaded, or the user's
            raise data.DatasetError(
                f"dataset {name!r} is not prepared under {root}: run `snakemake prepare_data` "
                f"or `python scripts/prepare_data.py {name} --root {root}` first"
            )
        if par.is_main:
            data.prepare(name, root)
        if par.world_size > 1:
            wait_until(lambda: data.is_ready(name, root), f"dataset {name} prepared by rank 0")
    meta = data.load_meta(name, root)
    common = dict(
        shard=par.shard,
        seed=effective_seed(spec),
        augment=spec["augment"],
        mean=meta["mean"],
        std=meta["std"],
        device=par.device,
        channels_last=spec["channels_last"],
    )
    batch = specs.per_device_batch(spec) if par.distributed else specs.global_batch(spec)
    loaders = [
        make_loader(
            spec["loader"],
            *data.load_split(name, root, split),
            batch=batch,
            train=split == "train",
            workers=spec["workers"],
            **common,
        )
        for split in ("train", "test")
    ]
    return meta, loaders


def wait_until(condition, what: str, timeout_s: float = 600) -> None:
    deadline = time.time() + timeout_s
    while not condition():
        if time.time() > deadline:
            raise TimeoutError(f"gave up waiting for {what}")
        time.sleep(0.2)


def effective_seed(spec: dict) -> int:
    return spec["seed"] + 1000 * spec["repeat"]


def with_user_code(env: dict, spec: dict) -> dict:
    """env with the hash of the user's factory in its code version (none for other models)."""
    user = models.factory_hash(spec["model"], spec["code_path"])
    return {**env, "code_version": {**env["code_version"], "user_hash": user}} if user else env


def run(spec: dict, out_dir: str, cell: str, t0: float, cores: int) -> int:
    """Train the cell and write out_dir/record.json; returns the process exit code."""
    outcome = Outcome(out_dir, cell, spec, t0)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        outcome.clear_previous()
    try:
        par = plan(spec)
    except Skip as skip:
        threads = threads_per_process(cores, int(os.environ.get("LOCAL_WORLD_SIZE", world)))
        outcome.env = environment(
            world, resolve_device(spec["device"]), threads, int(os.environ.get("GROUP_WORLD_SIZE", "1"))
        )
        outcome.env["ranks"] = [rank_host(rank, int(os.environ.get("LOCAL_RANK", "0")))]
        if rank == 0:
            print(f"[dpstudy] skipped: {skip}", flush=True)
            outcome.write("skipped", str(skip))
        return 0
    on_cpu = par.device.type == "cpu"
    threads = threads_per_process(cores, par.local_world_size) if on_cpu else torch.get_num_threads()
    pinned = pin_to_cores(par.local_rank, threads) if on_cpu else []  # before torch starts its threads
    torch.set_num_threads(threads)
    outcome.env = with_user_code(environment(par.world_size, par.device.type, threads, spec["nodes"]), spec)
    sampler = None
    try:
        par.start()
        outcome.env["ranks"] = par.all_gather_objects({**rank_host(par.rank, par.local_rank), "cores": pinned})
        if par.world_size > 1:
            outcome.watch(par.rank)
        torch.manual_seed(effective_seed(spec))
        meta, (train_data, test_data) = load_datasets(spec, par)
        channels, size = meta["shape"][0], meta["shape"][1]
        model = models.build(
            spec["model"], channels, size, len(meta["classes"]), spec["model_args"], spec["code_path"]
        ).to(par.device)
        if models.needs_ext(spec["model"]):
            check_kernels(par.devices())  # refuse a build without kernels for these GPUs, with the reason
        if spec["channels_last"]:
            model = model.to(memory_format=torch.channels_last)
        trainer = Trainer(
            spec, par, train_data, test_data, model, log=lambda line: par.is_main and print(line, flush=True)
        )
        sampler = UtilSampler(par.devices() if par.local_rank == 0 else []).start()
        outcome.startup_s = time.time() - t0
        trainer.run(outcome.epochs.append)
        outcome.util = sampler.stop()
        outcome.probe = probe.measure(trainer)
        with compiling_eager(trainer.compiled):  # the split the memory plan predicts: eager's
            outcome.memory = memory.measure(trainer)
        if par.is_main:
            outcome.write("ok")
        par.close()
        return 0
    except Exception as error:  # every fault becomes a record; see dpstudy.engine.outcome
        if sampler is not None:
            outcome.util = sampler.stop()
        return outcome.fault(error, par.rank, par.world_size)
