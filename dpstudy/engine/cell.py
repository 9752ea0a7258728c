"""Run one cell in this process (one rank of it): pick the mode, pin the cores, join the process
group, load the data, build the model, train, probe, measure memory, and write the record.
Every fault becomes a record (dpstudy.engine.outcome)."""

from __future__ import annotations

import os
import signal
import time

import torch

from dpstudy import models
from dpstudy.data import store as data
from dpstudy.data.task import TEXT, Task
from dpstudy.engine import cost, memory, probe, tracing
from dpstudy.engine.compiling import eager as compiling_eager
from dpstudy.engine.cores import pin_gpu_rank, pin_to_cores, threads_per_process
from dpstudy.engine.heartbeat import Heartbeat
from dpstudy.engine.loaders import make_loader
from dpstudy.engine.modes import Mode, Skip, mode_for, resolve_device
from dpstudy.engine.monitor import UtilSampler
from dpstudy.engine.outcome import Outcome
from dpstudy.engine.token_loader import make_token_loader, windows
from dpstudy.engine.train import Trainer, no_fault
from dpstudy.ext.loader import check_kernels
from dpstudy.record.envinfo import environment, rank_host
from dpstudy.study import spec as specs
from dpstudy.util.errors import ConfigError


def injected_fault(rank: int, cell: str):
    """Tests make one rank fail on purpose: DPSTUDY_INJECT_FAULT='KIND:RANK:EPOCH:STEP[@TEXT]', several
    separated by commas, each only in cells whose id contains TEXT (all without it). KIND is one of
    oom, error, hang (the rank stops answering, as a blocked data pipeline or a deadlock would),
    kill (SIGKILL, as the kernel's out-of-memory killer sends) or exit (os._exit(3), no cleanup)."""
    faults = {}
    for entry in filter(None, os.environ.get("DPSTUDY_INJECT_FAULT", "").split(",")):
        where, _, only = entry.partition("@")
        kind, at_rank, at_epoch, at_step = where.split(":")
        if only in cell and int(at_rank) == rank:
            faults[(int(at_epoch), int(at_step))] = kind
    if not faults:
        return no_fault

    def maybe_fail(epoch: int, step: int) -> None:
        kind = faults.get((epoch, step))
        if kind == "oom":
            raise torch.OutOfMemoryError(f"injected out-of-memory on rank {rank}")
        if kind == "hang":
            while True:
                time.sleep(60)
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "exit":
            os._exit(3)
        if kind is not None:
            raise RuntimeError(f"injected error on rank {rank}")

    return maybe_fail


def load_datasets(spec: dict, mode: Mode):
    """(the cell's Task, its meta.json, (train loader, test loader)), the dataset prepared first
    when it is generated."""
    root, name = spec["data_root"], spec["dataset"]
    if not data.is_ready(name, root):
        if name not in data.DATASETS or not data.DATASETS[name].generated:  # downloaded, or the user's
            raise data.DatasetError(
                f"dataset {name!r} is not prepared under {root}: run `snakemake prepare_data` "
                f"or `python scripts/prepare_data.py {name} --root {root}` first"
            )
        if mode.is_main:
            data.prepare(name, root)
        if mode.world_size > 1:
            wait_until(lambda: data.is_ready(name, root), f"dataset {name} prepared by rank 0")
    meta = data.load_meta(name, root)
    batch = specs.per_device_batch(spec) if mode.distributed else specs.global_batch(spec)
    common = dict(batch=batch, partition=mode.partition, seed=effective_seed(spec), device=mode.device)
    if meta.get("kind") == TEXT:
        task = Task.text(meta["vocab_size"], models.window(spec))
        splits = {split: data.load_tokens(name, root, split) for split in ("train", "test")}
        check_windows(spec, task, splits, mode.world_size)
        loaders = [
            make_token_loader(
                spec["loader"], tokens, seq_len=task.seq_len, train=split == "train", workers=spec["workers"], **common
            )
            for split, tokens in splits.items()
        ]
        return task, meta, loaders
    task = Task.image(meta["shape"][0], meta["shape"][1], len(meta["classes"]))
    images = dict(augment=spec["augment"], mean=meta["mean"], std=meta["std"], channels_last=spec["channels_last"])
    loaders = [
        make_loader(
            spec["loader"],
            *data.load_split(name, root, split),
            train=split == "train",
            workers=spec["workers"],
            **common,
            **images,
        )
        for split in ("train", "test")
    ]
    return task, meta, loaders


def check_windows(spec: dict, task: Task, splits: dict, ranks: int) -> None:
    """Every rank needs a window of each split: a seq_len too long for the corpus names both."""
    for split, tokens in splits.items():
        if windows(tokens, task.seq_len) < ranks:
            raise ConfigError(
                f"seq_len {task.seq_len} is too long for dataset {spec['dataset']!r}: its {split} split has "
                f"{len(tokens):,} tokens, {windows(tokens, task.seq_len)} windows of {task.seq_len + 1} for "
                f"{ranks} rank(s); use a shorter seq_len or more text"
            )


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


def model_builder(spec: dict, task: Task, device: torch.device | None):
    """A function that builds the cell's model on `device` in its memory format: the model trained,
    and any replica a probe times; with `device` None, where the default device says (the FLOP
    count's meta device). The outputs are the task's (classes, vocabulary), never read off a forward
    pass."""

    def build() -> torch.nn.Module:
        model = models.build(spec["model"], task, spec["model_args"], spec["code_path"])
        if device is None:
            return model
        model = model.to(device)
        return model.to(memory_format=torch.channels_last) if spec["channels_last"] else model

    return build


def skipped(outcome: Outcome, spec: dict, skip: Skip, cores: int) -> int:
    """A cell this hardware cannot run: its record says why (rank 0 writes it)."""
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    threads = threads_per_process(cores, int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    outcome.env = environment(
        world, resolve_device(spec["device"]), threads, int(os.environ.get("GROUP_WORLD_SIZE", "1"))
    )
    outcome.env["ranks"] = [rank_host(rank, int(os.environ.get("LOCAL_RANK", "0")))]
    if rank == 0:
        print(f"[dpstudy] skipped: {skip}", flush=True)
        outcome.write("skipped", str(skip))
    return 0


def run(spec: dict, out_dir: str, cell: str, t0: float, cores: int) -> int:
    """Train the cell and write out_dir/record.json; returns the process exit code."""
    outcome = Outcome(out_dir, cell, spec, t0)
    if int(os.environ.get("RANK", "0")) == 0:
        outcome.clear_previous()
    try:
        mode = mode_for(spec)
    except Skip as skip:
        return skipped(outcome, spec, skip, cores)
    on_cpu = mode.device.type == "cpu"
    threads = threads_per_process(cores, mode.local_world_size)
    # before torch starts its threads; a GPU rank in its GPU's share of the host (dpstudy.engine.cores)
    pinned = pin_to_cores(mode.local_rank, threads) if on_cpu else pin_gpu_rank(mode.local_rank, threads)
    torch.set_num_threads(threads)
    outcome.env = with_user_code(environment(mode.world_size, mode.device.type, threads, spec["nodes"]), spec)
    sampler = None
    try:
        mode.start()  # every rank is here, so rank 0 cleared the old heartbeats (clear_previous)
        heartbeat = Heartbeat(out_dir, mode.rank)
        outcome.env["ranks"] = mode.all_gather_objects({**rank_host(mode.rank, mode.local_rank), "cores": pinned})
        if mode.world_size > 1:
            outcome.watch(mode.rank)
        torch.manual_seed(effective_seed(spec))
        task, meta, (train_data, test_data) = load_datasets(spec, mode)
        outcome.learning_basis(task, meta)
        if mode.is_main:
            outcome.cost = cost.measure(spec, task, model_builder(spec, task, None))
        build = model_builder(spec, task, mode.device)
        model = build()
        if models.needs_ext(spec["model"]):
            check_kernels(mode.devices())  # refuse a build without kernels for these GPUs, with the reason
        trainer = Trainer(
            spec,
            mode,
            train_data,
            test_data,
            model,
            log=lambda line: mode.is_main and print(line, flush=True),
            build_replica=build,
            fault=injected_fault(mode.rank, cell),
            heartbeat=heartbeat,
        )
        sampler = UtilSampler(mode.devices() if mode.local_rank == 0 else []).start()
        outcome.startup_s = time.time() - t0
        outcome.stopped_early = trainer.run(outcome.epochs.append)
        outcome.util = sampler.stop()
        outcome.probe = probe.measure(trainer)
        with compiling_eager(trainer.compiled):  # the split the memory plan predicts: eager's
            outcome.memory = memory.measure(trainer)
        outcome.trace = tracing.capture(trainer, out_dir)  # last: its optimizer steps change the model
        if mode.is_main:
            outcome.write("ok")
        mode.close()
        return 0
    except Exception as error:  # every fault becomes a record; see dpstudy.engine.outcome
        if sampler is not None:
            outcome.util = sampler.stop()
        return outcome.fault(error, mode.rank, mode.world_size)
