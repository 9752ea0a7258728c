"""Training FLOPs per sample: one step's forward, loss and backward as torch.utils.flop_counter
counts them (matrix products, convolutions, attention: the convention of MFU), run on the meta
device: shapes only, no memory, no compute, no GPU, so a 124M-parameter model counts in a second.

What the counter does not see (elementwise ops, normalisations, softmax, the optimizer) is left out,
as MFU leaves it out. With `prepare` (e.g. activation checkpointing) the count includes what it
recomputes: the FLOPs the hardware runs, not the model's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch.nn as nn

    from dpstudy.data.task import Task

BATCH = 2  # BatchNorm needs more than one sample in training mode


class FlopCountError(RuntimeError):
    """The model cannot take a step on the meta device (a custom kernel, a value read back): its
    FLOPs are unknown. The caller records null and this message."""


def counted(
    build: Callable[[], nn.Module],
    task: Task,
    prepare: Callable[[nn.Module], nn.Module] | None = None,
    batch: int = BATCH,
) -> tuple[int, int]:
    """The parameters of the model `build()` makes on the meta device (after `prepare`) and the
    FLOPs of one training step of it on `batch` random samples of `task`; FlopCountError when
    the step fails there."""
    import torch

    with torch.device("meta"):
        model = build()
        if prepare is not None:
            model = prepare(model)
    model.train()
    params = sum(p.numel() for p in model.parameters())  # before to_empty below, which unties weights
    try:
        return params, step_flops(model, *task.example_batch(batch, "meta"))
    except Exception as error:
        on_meta = error
    # transformers' masks read values back (is every sequence whole?) unless the tensors are fake,
    # which meta tensors are not: the same step on fake tensors, shapes only too
    from torch._subclasses.fake_tensor import FakeTensorMode

    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            fake = model.to_empty(device="cpu")
            return params, step_flops(fake, *task.example_batch(batch, "cpu"))
    except Exception:
        pass
    raise FlopCountError(
        f"cannot count FLOPs on the meta device: {type(on_meta).__name__}: {str(on_meta).strip()[:300]}"
    ) from on_meta


def step_flops(model: nn.Module, x, y) -> int:
    """FLOPs of model(x), its cross-entropy against y and backward, as FlopCounterMode counts them."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    # The counter counts scaled_dot_product_attention's flash, memory-efficient and cuDNN kernels
    # (CUDA) and the matrix products of its math decomposition, but not CPU's fused kernel
    # (_scaled_dot_product_flash_attention_for_cpu), which fake CPU tensors would take: under the
    # math backend attention is counted wherever the step runs, as the full T x T products (as the
    # counter counts the fused kernels). The meta device has no fused kernel and takes it anyway.
    with counter, sdpa_kernel(SDPBackend.MATH):
        logits = model(x)
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).backward()
    return counter.get_total_flops()


def train_flops_per_sample(
    build: Callable[[], nn.Module],
    task: Task,
    prepare: Callable[[nn.Module], nn.Module] | None = None,
    batch: int = BATCH,
) -> int:
    """FLOPs of one training step (forward, loss, backward) per sample of `task`, of the model
    `build()` makes (and `prepare` transforms), counted on the meta device."""
    return counted(build, task, prepare, batch)[1] // batch


def cost(build: Callable[[], nn.Module], task: Task) -> dict[str, int]:
    """{"params": the model's parameters, "train_flops_per_sample": train_flops_per_sample}."""
    params, flops = counted(build, task)
    return {"params": params, "train_flops_per_sample": flops // BATCH}
