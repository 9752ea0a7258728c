"""activation_checkpointing (a study setting): memory that forward keeps for backward, traded
for compute that backward does again. Each mode applies it first, before compile and before
wrapping the model in DDP or FSDP, as torchtitan does (dpstudy.engine.modes).

  none       every tensor that forward's ops save stays until backward (PyTorch's default)
  full       each block keeps its input only. Backward runs the block's forward again first
             (torch.utils.checkpoint, non-reentrant, through checkpoint_wrapper, as torchtitan's
             apply_ac does)
  selective  each block keeps the outputs of its matrix products, attention and convolutions
             (SAVED_OPS: the costly ops) and recomputes the rest (normalisation, activations,
             pooling, element-wise ops): torchtitan's op-level selective checkpointing, without
             its rule of recomputing every other matrix product

The blocks are dpstudy.engine.blocks', the units FSDP shards. A composite block (a residual or a
transformer block) is wrapped as it is. A block that is one layer of a Sequential (a plain CNN:
LeNet, VGG) is wrapped together with the layers after it that hold no parameters or only a
normalisation's, up to the next block: conv, BatchNorm, ReLU and pool are one segment. The layer
alone would gain nothing, because checkpointing keeps the layer's input, and that is all a
convolution or a Linear layer keeps for backward anyway. A layer with nothing after it (the
classifier's last Linear) is not wrapped. Each segment is a Sequential put in place of its
layers, so the state dict's names get one more level.

Selective checkpointing refuses a kept output that a later op overwrites in place (VGG's
ReLU(inplace=True) after a Linear layer): inside its blocks, activation layers run out of place,
the same values in a tensor of their own.

Recomputing BatchNorm in training mode would update its running statistics a second time each
step, and evaluation would then see other statistics than without checkpointing. So while a block
recomputes, its BatchNorm layers run with momentum 0, which leaves the statistics exactly as they
were, and their batch counts are put back afterwards.
"""

from __future__ import annotations

import contextlib
import functools
from collections import OrderedDict
from collections.abc import Iterator

import torch
import torch.nn as nn

from dpstudy.engine.blocks import blocks, is_block, parents

HOW = ("none", "full", "selective")
# The ops whose outputs selective checkpointing keeps: matrix products, attention (every fused
# kernel torch has, where it has it) and convolution.
SAVED_NAMES = (
    "mm",
    "addmm",
    "bmm",
    "convolution",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_fused_attention_overrideable",
)
SAVED_OPS = frozenset(getattr(torch.ops.aten, n).default for n in SAVED_NAMES if hasattr(torch.ops.aten, n))


def how_of(spec: dict) -> str:
    """The cell's activation checkpointing: its setting, or none when it is null (the default)."""
    return spec.get("activation_checkpointing") or "none"


def apply(model: nn.Module, how: str) -> nn.Module:
    """`model` with its blocks wrapped for checkpointing `how` (see the module's docstring).
    Modules are replaced in place, and the model itself is returned."""
    if how not in HOW:
        raise ValueError(f"activation_checkpointing {how!r} is not one of {', '.join(HOW)}")
    if how == "none":
        return model
    where = parents(model)
    for block in blocks(model):
        parent, name = where[id(block)]
        if any(True for _ in block.children()):
            parent.register_module(name, wrapped(block, how))
        elif type(parent) is nn.Sequential:
            segment(parent, name, how)
    return model


def segment(sequential: nn.Sequential, name: str, how: str) -> None:
    """Wrap the layer `name` of `sequential` together with the layers after it up to the next
    block, as one Sequential under the layer's name; a layer with nothing after it stays."""
    names = list(sequential._modules)
    start = end = names.index(name)
    while end + 1 < len(names) and not is_block(sequential._modules[names[end + 1]]):
        end += 1
    if end == start:
        return
    group = nn.Sequential(OrderedDict((n, sequential._modules[n]) for n in names[start : end + 1]))
    rebuilt = OrderedDict(
        (n, wrapped(group, how) if n == name else sequential._modules[n])
        for n in names
        if not start < names.index(n) <= end
    )
    sequential._modules.clear()
    sequential._modules.update(rebuilt)


def wrapped(module: nn.Module, how: str) -> nn.Module:
    """`module` inside checkpoint_wrapper, checkpointed `how` (checkpointed_call)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    if how == "selective":
        for layer in module.modules():
            if getattr(layer, "inplace", False) is True:  # ReLU(inplace=True), Dropout(inplace=True) ...
                layer.inplace = False
    return checkpoint_wrapper(module, checkpoint_fn=functools.partial(checkpointed_call, how))


def checkpointed_call(how: str, module: nn.Module, *args, **kwargs):
    """module(*args, **kwargs) under torch.utils.checkpoint: non-reentrant, the random state kept
    for recomputing (dropout draws the same mask again), BatchNorm's statistics left alone while
    it recomputes. The BatchNorm layers are looked up at each call: a DataParallel replica calls
    with its own copies of them. Under torch.compile the compiler recomputes inside its backward
    graph, which replays no buffer's update, and takes no context but selective checkpointing's."""
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    if torch.compiler.is_compiling():
        if how == "selective":  # a partial made here: Dynamo takes a context_fn in no other form
            context = functools.partial(create_selective_checkpoint_contexts, keep_products)
            return checkpoint(module, *args, use_reentrant=False, context_fn=context, **kwargs)
        return checkpoint(module, *args, use_reentrant=False, **kwargs)
    norms = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats]

    def context_fn():
        if how == "selective":
            forward, recompute = create_selective_checkpoint_contexts(keep_products)
        else:
            forward, recompute = contextlib.nullcontext(), contextlib.nullcontext()
        return forward, both(statistics_kept(norms), recompute)

    return checkpoint(module, *args, use_reentrant=False, preserve_rng_state=True, context_fn=context_fn, **kwargs)


def keep_products(ctx, func, *args, **kwargs):
    """Selective checkpointing's policy: keep what SAVED_OPS make, recompute everything else."""
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if func in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


@contextlib.contextmanager
def both(outer, inner) -> Iterator[None]:
    # the statistics' guard outermost: its own copies stay outside selective checkpointing's mode
    with outer, inner:
        yield


@contextlib.contextmanager
def statistics_kept(norms: list[nn.Module]) -> Iterator[None]:
    """BatchNorm's running statistics unchanged by what runs inside: momentum 0 keeps the running
    mean and variance exactly (x (1 - 0) + batch x 0), and the batch counts are put back."""
    if not norms:
        yield
        return
    momenta = [m.momentum for m in norms]
    counts = [m.num_batches_tracked.clone() for m in norms]
    for m in norms:
        m.momentum = 0.0
    try:
        yield
    finally:
        for m, momentum, count in zip(norms, momenta, counts, strict=True):
            m.momentum = momentum
            m.num_batches_tracked.copy_(count)
