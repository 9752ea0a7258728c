"""The model registry: every model of the source reports, adapted to any dataset shape.

The registry names import paths rather than classes so that reading it (the Snakefile does,
for validation) does not import torch.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch.nn as nn


@dataclass(frozen=True)
class ModelInfo:
    name: str
    target: str  # "module:Class"; the class takes (channels, size, classes)
    source: str  # which source report it reproduces
    needs_ext: bool = False  # uses the project's C++/CUDA extension


MODELS: dict[str, ModelInfo] = {
    m.name: m
    for m in (
        ModelInfo("lenet", "dpstudy.models.lenet:LeNet", "000 exp 1"),
        ModelInfo("lenet_ext", "dpstudy.models.lenet_ext:LeNetExt", "002 task 3", needs_ext=True),
        ModelInfo("vgg_bn", "dpstudy.models.vgg:VGGBN", "000 exp 2"),
        ModelInfo("vgg19", "dpstudy.models.vgg:VGG19", "001"),
        ModelInfo("resnet18", "dpstudy.models.resnet:ResNet18", "003"),
        ModelInfo("simplecnn", "dpstudy.models.simplecnn:SimpleCNN", "004 Q2"),
        ModelInfo("vit", "dpstudy.models.vit:ViT", "issue 16"),
    )
}


def model_class(name: str) -> type:
    module, cls = MODELS[name].target.split(":")
    return getattr(importlib.import_module(module), cls)


def build(name: str, channels: int, size: int, classes: int = 10) -> nn.Module:
    if name not in MODELS:
        raise KeyError(f"model {name!r} is not one of {sorted(MODELS)}")
    return model_class(name)(channels, size, classes)


def cost(name: str, channels: int, size: int, classes: int = 10) -> dict[str, int]:
    """Parameter count and training FLOPs per sample (forward + backward, counted by torch)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    model = build(name, channels, size, classes)
    batch = 2  # BatchNorm needs more than one sample in training mode
    x = torch.randn(batch, channels, size, size)
    counter = FlopCounterMode(display=False)
    with counter:
        model(x).sum().backward()
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "train_flops_per_sample": counter.get_total_flops() // batch,
    }
