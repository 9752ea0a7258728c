"""A model's blocks: the units FSDP shards one by one (dpstudy.engine.modes.fsdp) and activation
checkpointing wraps (dpstudy.engine.checkpointing), found the same way for both.

A block is an element of a top-level Sequential or ModuleList (ResNet's residual blocks, ViT's and
GPT's transformer blocks, a CNN's convolutions and linear layers), else a top-level child itself.
A top-level child that is a model of its own (a wrapper around a Hugging Face model:
`model.transformer.h`, `model.model.layers`) gives the repeated blocks found below it instead:
as one unit it would gather the whole model at once. Normalisation layers and modules without
parameters are never blocks.
"""

from __future__ import annotations

import torch.nn as nn

# Normalisation layers hold a few parameters each: a unit of their own would cost an all-gather
# for almost nothing, so they stay with the root.
NORM_LAYERS = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm)
CONTAINERS = (nn.Sequential, nn.ModuleList)


def holds_parameters(module: nn.Module) -> bool:
    return any(True for _ in module.parameters())


def numel(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def is_block(module: nn.Module) -> bool:
    return not isinstance(module, NORM_LAYERS) and holds_parameters(module)


def blocks(model: nn.Module) -> list[nn.Module]:
    """The model's blocks below the root, in order (see the module's docstring)."""
    found = []
    for child in model.children():
        if isinstance(child, CONTAINERS):
            parts = list(child)
        else:
            repeated = repeated_blocks(child)
            parts = list(repeated) if repeated is not None else [child]
        found += [m for m in parts if is_block(m)]
    return found


def repeated_blocks(module: nn.Module) -> nn.Module | None:
    """The container below `module` whose elements are two or more composite modules of one class
    (transformer layers, not an MLP's Linear layers) holding the most parameters; None when there
    is none (a layer, or a composite module without repeated blocks: it stays one block)."""
    candidates = [
        m
        for m in module.modules()
        if isinstance(m, CONTAINERS)
        and len(m) >= 2
        and len({type(e) for e in m}) == 1
        and all(any(True for _ in e.children()) for e in m)
        and holds_parameters(m)
    ]
    return max(candidates, key=numel, default=None)


def parents(model: nn.Module) -> dict[int, tuple[nn.Module, str]]:
    """{id(module): (its parent, its name there)} for every module below `model`."""
    return {id(child): (parent, name) for parent in model.modules() for name, child in parent.named_children()}
