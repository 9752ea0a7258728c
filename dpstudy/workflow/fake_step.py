"""The memory plan's fake training step (dpstudy.workflow.memory_plan): the cell's own Trainer on
fake tensors (FakeTensorMode: shapes, dtypes and devices, no data, no kernels), followed by the
tracker that dpstudy.engine.memory measures the cell with after training; a mode that the modes'
table marks `fake` (FSDP) runs itself over a fake process group of the cell's world size, the
others the plain model at the per-device batch. On a GPU host, the libraries' workspaces beside it."""

from __future__ import annotations

import contextlib

from dpstudy.data.task import Task
from dpstudy.study import modes
from dpstudy.study import spec as specs


def faked(spec: dict) -> bool:
    """Whether the plan runs the cell's mode itself on fake tensors (FSDP), not the plain model's step."""
    return modes.TABLE[spec["mode"]].memory == "fake"


def workspace_on_this_gpu(spec: dict, step_peak_mb: float, convs: list) -> float | None:
    """MB the libraries' workspaces add to a CUDA cell's step peak (dpstudy.workflow.workspaces):
    cuBLAS's, which the process keeps, and how far cuDNN's lift the step's peak; measured on the
    GPU the plan reserved (rule memory_plan). None where the cell does not run on CUDA, this
    process sees no GPU (a plan made on a cluster's login node: the part the plan says it cannot
    see) or the GPU could not run them (out of memory under another job)."""
    import torch

    if spec["device"] == "cpu" or not torch.cuda.is_available():
        return None
    from dpstudy.engine.train import AMP_DTYPES
    from dpstudy.workflow import workspaces

    amp_dtype, device = AMP_DTYPES.get(spec["precision"]), torch.device("cuda", 0)
    try:
        # first, before any other matrix product in this process
        blas = workspaces.blas_once(device, amp_dtype, log=lambda line: print(f"[dpstudy] memory plan: {line}"))
        return blas + (workspaces.above_step_peak_mb(convs, step_peak_mb, device, amp_dtype) if convs else 0.0)
    except RuntimeError as error:  # a GPU another job fills: the rest of the plan stands
        print(f"[dpstudy] memory plan: workspaces not measured: {str(error).splitlines()[0]}", flush=True)
        return None


def tracked_fake_step(spec: dict, task: Task, batch: int) -> tuple[dict, tuple[int, ...], list]:
    """The tracker's split of one fake training step of the cell's model (dpstudy.engine.memory),
    the bytes of each of its trainable parameters (their sum: one copy of the gradients), and its
    convolutions with the tracker's peaks around them (dpstudy.workflow.workspaces.ConvAt)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from dpstudy import models
    from dpstudy.engine import checkpointing, memory
    from dpstudy.engine.modes import MODES
    from dpstudy.engine.train import Trainer
    from dpstudy.workflow import workspaces

    world = specs.devices(spec)
    sharded = faked(spec)
    # ddp and dp: the plain model at the per-device batch (see the docstring); every mode
    # checkpoints activations as the cell does; hybrid's replicas make its mesh two-dimensional
    cls = MODES[spec["mode"] if sharded else modes.BASELINE]
    mode = cls(
        torch.device("cpu"),
        world if sharded else 1,
        shard=specs.shard_of(spec["mode"], spec.get("shard", "none")),
        world_size=world if sharded else 1,
        options=cls.options_of(spec) if sharded else {},
        checkpointing=checkpointing.how_of(spec),
    )
    with fake_process_group(world) if sharded else contextlib.nullcontext():
        if sharded:
            mode.device_mesh()  # outside FakeTensorMode, which cannot make one
        # built on the meta device, where initialisers do nothing: some (trunc_normal_'s rejection
        # sampling) read values back, which fake tensors cannot; the step needs shapes only
        with torch.device("meta"):
            model = models.build(spec["model"], task, spec["model_args"], spec["code_path"])
        # non-fake inputs (the meta parameters to_empty replaces) become fake tensors
        with FakeTensorMode(allow_non_fake_inputs=True):
            model = model.to_empty(device="cpu")
            if spec["channels_last"]:
                model = model.to(memory_format=torch.channels_last)
            # a spec without compile: eager; compiled graphs keep at most what eager keeps
            trainer = Trainer({**spec, "compile": False}, mode, None, None, model, log=lambda _: None)
            # fp16's GradScaler reads its found-inf flag, which fake tensors do not have: its
            # in-place unscale allocates nothing the split would show
            trainer.scaler = torch.amp.GradScaler("cpu", enabled=False)
            x, y = task.example_batch(batch)
            if spec["channels_last"] and not task.is_text:
                x = x.contiguous(memory_format=torch.channels_last)
            trainer.step(x, y)  # as after training: the optimizer's state exists
            seen, hooks = workspaces.watch_inputs(trainer.model)
            own = mode.tracker(trainer.model, trainer.optimizer)
            tracker = memory.tracked(trainer.model, trainer.optimizer, lambda: trainer.step(x, y), own)
            for hook in hooks:
                hook.remove()
            (parts,) = memory.peak_split(tracker).values()
            sizes = tuple(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return parts, sizes, workspaces.convs_at_step(tracker, seen)


@contextlib.contextmanager
def fake_process_group(world: int):
    """A process group of `world` ranks, this one rank 0, whose collectives do nothing (one rank
    too: FSDP's device mesh needs a group)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()
