"""compile: true (a study setting): where torch.compile goes for each mode, how the steps that
compiled are timed apart from the steady window, and the compiler's failures as a clear reason.

torch.compile compiles lazily, at the first call with inputs no compiled graph's guards accept (the
first step; an epoch's smaller last batch), so the steps that compiled are the ones to time apart
(`timed_compile`): the trainer leaves them out of the steady window and records their seconds as
compile_s. Evaluation and the memory split run the compiled model eagerly (`eager`).
"""

from __future__ import annotations

import contextlib
import time
import types

import torch
import torch.nn as nn

from dpstudy.engine.parallel import Parallel, shard_units


@contextlib.contextmanager
def timed_compile(enabled: bool, par: Parallel):
    """`.seconds`: the wall time of the enclosed call when it compiled a graph (0 otherwise).
    torch.compile compiles lazily, at the first call with inputs no compiled graph's guards
    accept (the first step; a smaller last batch; eval mode), so the steps that compiled are
    the ones to time apart. Clocks read after a device synchronize, as the epoch's are."""
    timing = types.SimpleNamespace(seconds=0.0)
    if not enabled:
        yield timing
        return
    graphs = compiled_graphs()
    start = time.perf_counter()
    yield timing
    if compiled_graphs() != graphs:
        par.synchronize()
        timing.seconds = time.perf_counter() - start


def eager(enabled: bool):
    """Compiled modules run eagerly inside the block (torch.compiler.set_stance("force_eager")):
    evaluation and the memory split, which compile is not measured for, then cost no compile of
    their own (eval mode's graphs, the memory tracker's dispatch mode); the math is the same."""
    return torch.compiler.set_stance("force_eager") if enabled else contextlib.nullcontext()


def compiled_graphs() -> int:
    """Graphs Dynamo has compiled in this process (a recompile adds one)."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


COMPILE_OPTIONS = {"dynamic": False}  # static shapes: one graph per batch size (the last batch's too)


def compile_before_wrap(model: nn.Module, par: Parallel) -> nn.Module:
    """dp and fsdp compile what their wrapper will hold.

    dp: the module inside nn.DataParallel, which on one device (or CPU) calls it directly. On
    several GPUs DataParallel replicates the module every step and runs the replicas in threads,
    which torch.compile does not support: such a cell fails with that reason (ddp is the way).

    fsdp: FSDP2 as torchtitan applies it: each block (`shard_units`) compiled first, then
    `fully_shard` on the compiled blocks and the root. The whole model compiled after fully_shard
    would trace FSDP2's pre/post-forward hooks (all-gather, reshard) into the graph, which Dynamo
    supports only with compiled autograd; per-block compile leaves the hooks, and so the
    communication and its overlap, to FSDP2 at the block boundaries, and compiles each repeated
    block's code once."""
    if par.mode == "dp":
        if len(par.devices()) > 1:
            raise CompileFailed(
                "compile: true is not supported with mode dp on several GPUs: nn.DataParallel replicates "
                "the module every step and runs the replicas in threads, which torch.compile cannot trace "
                "(compile a ddp cell instead)"
            )
        return torch.compile(model, **COMPILE_OPTIONS)
    if par.mode == "fsdp":
        parents = {id(child): (parent, name) for parent in model.modules() for name, child in parent.named_children()}
        units = shard_units(model)
        # Dynamo keeps a limited number of graphs per code object, and the units of one class share
        # their forward's code (LeNet's three Linear layers, ResNet's eight blocks), each with its
        # own shapes, for a full and a smaller last batch (evaluation runs eagerly): room for them
        # all, or the units past the limit would silently run uncompiled.
        config = torch._dynamo.config
        config.cache_size_limit = max(config.cache_size_limit, 4 * len(units))
        for unit in units:
            parent, name = parents[id(unit)]
            setattr(parent, name, torch.compile(unit, **COMPILE_OPTIONS))  # shard_units then finds it
    return model


def compile_after_wrap(model: nn.Module, par: Parallel) -> nn.Module:
    """single: the model. ddp: the DDP-wrapped model, as PyTorch documents for DDP (Dynamo's DDP
    support): Dynamo's DDPOptimizer (torch._dynamo.config.optimize_ddp, on by default) splits the
    compiled graph at DDP's gradient-bucket boundaries, so each bucket's all-reduce still starts
    while the rest of backward runs, as uncompiled DDP overlaps them."""
    if par.mode in ("single", "ddp"):
        return torch.compile(model, **COMPILE_OPTIONS)
    return model


class CompileFailed(RuntimeError):
    """torch.compile could not compile the model; the message is the compiler's own."""


def compiler_message(error: BaseException) -> str:
    """The compiler's message in one line: its first lines, without Dynamo's advice on logging."""
    advice = ("Set TORCHDYNAMO_VERBOSE", "You can suppress", "import torch._dynamo", "torch._dynamo.config.suppress")
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith(advice)]
    return " ".join(lines[:2])[:400] or type(error).__name__


@contextlib.contextmanager
def compiler_errors(enabled: bool):
    """An error of Dynamo or Inductor (a missing C++ compiler, an op it cannot compile) becomes a
    CompileFailed whose first line is the compiler's message: the cell's `failed` reason."""
    try:
        yield
    except Exception as error:
        if enabled and type(error).__module__.startswith(("torch._dynamo", "torch._inductor")):
            raise CompileFailed(f"torch.compile failed: {compiler_message(error)}") from error
        raise
