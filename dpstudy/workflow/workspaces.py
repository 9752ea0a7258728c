"""What the libraries' workspaces add to a CUDA step's allocator peak: the part of the memory plan
that no fake step can see, measured on the cell's kind of GPU where the plan runs beside one.
cuBLAS keeps a workspace per handle and stream for the whole process (blas_workspaces_mb); cuDNN
takes one per convolution call, by shape (below).

cuDNN (benchmark mode off, as cells run) picks a convolution's algorithm from its shapes alone,
and takes the algorithm's workspace from PyTorch's caching allocator, so it counts in
max_memory_allocated. Which algorithm it picks does not follow the batch: on an H100, SimpleCNN's
second convolution needed 56, 110, 26, 53 and 101 MB of backward workspace at batches 64 to 1024
(benchmarks/cuda_workspace.py), so no line through other batches forecasts it. The same
convolution run alone at its shape in the step chooses the same algorithm; its workspace is what
its allocator peak holds beyond the tensors it reads and makes.

A workspace raises the step's peak only where it lands on top of what the step holds at that
moment: the tracker's peak inside that convolution's forward or backward (MemTracker's per-module
PEAK_FW / PEAK_BW, on the same fake step the plan takes). So the plan adds
max(0, max over convolutions of (local peak + workspace) - the step's peak). On the H100 that
explained SimpleCNN's +96 MB at batch 128 and the +5 MB at batch 1024, where the largest
workspace comes late in backward, once most activations are freed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

MB = 2**20
CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


@dataclass(frozen=True)
class ConvAt:
    """One convolution as the fake step ran it, and the tracker's local peaks (MB) around it."""

    kind: type  # nn.Conv1d, nn.Conv2d or nn.Conv3d
    config: tuple  # in, out, kernel, stride, padding, dilation, groups, bias, padding_mode
    input_shape: tuple[int, ...]
    input_grad: bool  # backward computes the input's gradient (not for the first layer)
    channels_last: bool
    peak_fw_mb: float
    peak_bw_mb: float


def conv_kind(module: nn.Module) -> type | None:
    return next((kind for kind in CONVS if isinstance(module, kind)), None)


def watch_inputs(model: nn.Module) -> tuple[dict, list]:
    """{conv module: its input's (shape, requires_grad, channels_last)}, filled as the model runs,
    and the hooks (remove them after)."""
    seen: dict = {}

    def hook(module, args):
        x = args[0]
        # a channels_last tensor (a one-channel one is both: taken as contiguous)
        channels_last = x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
        seen[module] = (tuple(x.shape), bool(x.requires_grad), channels_last)

    hooks = [m.register_forward_pre_hook(hook) for m in model.modules() if conv_kind(m)]
    return seen, hooks


def convs_at_step(tracker, seen: dict) -> list[ConvAt]:
    """Every convolution the tracked step ran, with its local forward and backward peaks."""
    from torch.distributed._tools.mem_tracker import _ModState

    found = []
    for module, (shape, input_grad, channels_last) in seen.items():
        stats = tracker.memory_tracking.get(module)
        if stats is None:
            continue
        peaks = [_local_peak(stats, state) for state in (_ModState.PEAK_FW, _ModState.PEAK_BW)]
        config = (
            module.in_channels,
            module.out_channels,
            module.kernel_size,
            module.stride,
            module.padding,
            module.dilation,
            module.groups,
            module.bias is not None,
            module.padding_mode,
        )
        found.append(ConvAt(conv_kind(module), config, shape, input_grad, channels_last, *peaks))
    return found


def _local_peak(stats, state) -> float:
    snapshots = stats.snapshots.get(state) or [{}]
    return max((snap.get("Total", 0) for snap in snapshots[-1].values()), default=0) / MB


def workspace_mb(conv: ConvAt, device: torch.device, amp_dtype: torch.dtype | None) -> tuple[float, float]:
    """(forward, backward) workspace of `conv` run alone on `device` at its step's shape: the
    allocator's peak beyond the tensors each reads and makes, in MB. Under mixed precision the
    convolution runs in `amp_dtype` directly (autocast's copies of input and weight are the
    step's, which the tracker counts, not the workspace's)."""
    dtype = amp_dtype or torch.float32
    made = conv.kind(*conv.config).to(device=device, dtype=dtype)
    x = torch.randn(conv.input_shape, device=device, dtype=dtype)
    if conv.channels_last:
        made, x = made.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    x.requires_grad_(conv.input_grad)
    wanted = ([x] if conv.input_grad else []) + list(made.parameters())
    out = _beyond(device, lambda: made(x))
    forward = out.peak - _mb(out.value)
    grad_out = torch.ones_like(out.value)
    grads = _beyond(device, lambda: torch.autograd.grad(out.value, wanted, grad_out))
    return max(forward, 0.0), max(grads.peak - _mb(*grads.value), 0.0)


@dataclass
class _Peak:
    value: object
    peak: float  # MB the allocator's peak rose above what it held before


def _beyond(device: torch.device, run) -> _Peak:
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    value = run()
    torch.cuda.synchronize(device)
    return _Peak(value, (torch.cuda.max_memory_allocated(device) - before) / MB)


def _mb(*tensors) -> float:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None) / MB


def blas_workspaces_mb(device: torch.device, amp_dtype: torch.dtype | None = None) -> float:
    """MB cuBLAS and cuBLASLt keep once a process first multiplies matrices on `device`: PyTorch
    gives each handle and stream a workspace from the caching allocator and keeps it (32 MiB each
    on a Hopper GPU), so every step after the first holds them, in max_memory_allocated. Measured
    as the allocator's growth over one Linear layer's forward and backward, its tensors freed; 0
    where this process has multiplied on the device before (blas_once keeps the first figure)."""
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    for dtype in dict.fromkeys((torch.float32, amp_dtype or torch.float32)):
        layer = nn.Linear(64, 64).to(device=device, dtype=dtype)
        x = torch.randn(32, 64, device=device, dtype=dtype, requires_grad=True)
        layer(x).sum().backward()
        del layer, x
    torch.cuda.synchronize(device)
    return (torch.cuda.memory_allocated(device) - before) / MB


_BLAS: dict[torch.device, float] = {}


def blas_once(device: torch.device, amp_dtype: torch.dtype | None = None, log=None) -> float:
    """blas_workspaces_mb, measured at this process's first call for `device` (and said to `log`)
    and kept."""
    if device not in _BLAS:
        _BLAS[device] = blas_workspaces_mb(device, amp_dtype)
        if log:
            log(f"cuBLAS's workspaces on {device}: {_BLAS[device]:.1f} MB")
    return _BLAS[device]


def above_step_peak_mb(
    convs: list[ConvAt], step_peak_mb: float, device: torch.device, amp_dtype: torch.dtype | None = None, measure=None
) -> float:
    """MB the workspaces lift the step's peak by: max(0, max over convolutions of local peak +
    workspace - the step's peak). `measure` (tests): workspace_mb's stand-in. Each distinct
    convolution and shape is measured once; the device's cache is emptied after."""
    measure = measure or workspace_mb
    measured: dict = {}
    highest = 0.0
    for conv in convs:
        key = (conv.kind, conv.config, conv.input_shape, conv.input_grad, conv.channels_last)
        if key not in measured:
            measured[key] = measure(conv, device, amp_dtype)
        forward, backward = measured[key]
        highest = max(highest, conv.peak_fw_mb + forward, conv.peak_bw_mb + backward)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return max(highest - step_peak_mb, 0.0)
