"""compile: true (a study setting): how the steps that compiled are timed apart from the steady
window, and the compiler's failures as a clear reason. Where torch.compile goes is each mode's
(dpstudy.engine.modes: `prepare`).

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


@contextlib.contextmanager
def timed_compile(enabled: bool, mode):
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
        mode.synchronize()
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
