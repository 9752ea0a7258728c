"""What a cell's device must have free, from its predicted allocator peak: the one formula of the
memory plan's budget check (dpstudy.jobs.memory_plan) and of the forecasts' "will it fit"
(dpstudy.analysis.capacity, the report's figure). Kept apart from both so that the report's code
does not reach the training code through the plan's fake steps.
"""

from __future__ import annotations

GIB = 1024  # MB per GiB
# What a CUDA process holds beyond the allocator's tensors: the CUDA context and the libraries'
# buffers (record memory.context_mb: 758-760 MB on an H100 under torch 2.11 and CUDA 13), and what
# allocated_mb misses: 77-167 MB of cuDNN and cuBLAS workspaces where the plan had no GPU to measure
# them, 6-24 MB where it had (`make gpu-check`, item forecast). Rounded up for other devices.
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
