"""What a cell's device must have free, from its predicted allocator peak: the one formula of the
memory plan's budget check (dpstudy.workflow.memory_plan) and of the forecasts' "will it fit"
(dpstudy.analysis.capacity, the report's figure). Kept apart from both so that the report's code
does not reach the training code through the plan's fake steps.
"""

from __future__ import annotations

GIB = 1024  # MB per GiB
# What a CUDA process holds beyond the allocator's tensors: the CUDA context and the libraries'
# buffers (each CUDA cell records it: memory.context_mb), and what allocated_mb misses: cuDNN's
# and cuBLAS's workspaces where the plan had no GPU to measure them (`make gpu-check`'s forecast
# check reports both; docs/report.md quotes them). 1 GiB covers both with room on the GPUs measured.
CUDA_RUNTIME_MB = 1024
# The caching allocator rounds every block up and keeps segments that later blocks fragment: what
# it must find free is more than the peak it hands out.
FRAGMENTATION = 0.10


def need_of(peak_mb: float, on_cuda: bool, context_mb: float | None = None) -> float:
    """What a device must have free for a step whose allocator peak is `peak_mb`: the peak with the
    fragmentation margin and, on CUDA, the context and workspaces (a measured context_mb where one
    is known, whose workspaces a forecast's peak already holds; else CUDA_RUNTIME_MB)."""
    runtime = (CUDA_RUNTIME_MB if context_mb is None else context_mb) if on_cuda else 0.0
    return peak_mb * (1 + FRAGMENTATION) + runtime
