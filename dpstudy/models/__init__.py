"""The models a study can name, each adapted to any dataset shape:

  a registry name     every model of the source reports (MODELS)
  torchvision:<name>  a classification model of torchvision.models, random weights
  timm:<name>         a model of timm (optional dependency: pip install dpstudy[timm]), random weights
  <module>:<callable> a factory of the user's, importable from the study's code_path or the Python
                      path, called with num_classes, in_channels, image_size and the cell's model_args

The registry names import paths rather than classes so that reading it (the Snakefile does,
for validation) does not import torch; so does everything here but build and cost.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpstudy.util import refs
from dpstudy.util.errors import ConfigError
from dpstudy.util.hashing import tree_sha256

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


# `<library>:<name>` models, built by dpstudy.models.external (timm names may carry a .tag)
LIBRARIES = ("torchvision", "timm")
LIBRARY_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$(?!\n)")
KINDS = ("registry", *LIBRARIES, "factory")


def kind(model: str) -> str:
    """Which of KINDS `model` names; ConfigError when it is none of them."""
    if model in MODELS:
        return "registry"
    library, _, name = model.partition(":")
    if library in LIBRARIES and LIBRARY_NAME.match(name):
        return library
    if refs.split(model):
        return "factory"
    raise ConfigError(
        f"model {model!r} is not one of {sorted(MODELS)}, torchvision:<name>, timm:<name> "
        "or a factory <module>:<callable>"
    )


def token(model: str) -> str:
    """The model as a cell id spells it: a registry name as it is, torchvision_resnet18,
    timm_convnext_atto, a factory's name and a short hash of its reference (make_net_3fa2c1)."""
    model_kind = kind(model)
    if model_kind == "registry":
        return model
    if model_kind == "factory":
        return refs.token(model)
    return refs.safe_token(model.replace(":", "_"))


def needs_ext(model: str) -> bool:
    """Whether the model runs the project's C++/CUDA extension (registry models only)."""
    return model in MODELS and MODELS[model].needs_ext


def source_file(model: str, code_path: str | Path | None = None) -> Path | None:
    """The user factory's source file (its module), or None for a registry or library model."""
    return refs.source_file(model, code_path) if kind(model) == "factory" else None


def factory_hash(model: str, code_path: str | Path | None = None) -> str | None:
    """sha256 (12 hex digits) of a user factory's source file, by name and content, as a record
    keeps it (code_version.user_hash): editing it flags the cells made with it, as editing
    dpstudy's training code does. None for a registry or library model."""
    factory = source_file(model, code_path)
    return tree_sha256([factory], factory.parent)[:12] if factory else None


def model_class(name: str) -> type:
    module, cls = MODELS[name].target.split(":")
    return getattr(importlib.import_module(module), cls)


def build(
    name: str,
    channels: int,
    size: int,
    classes: int = 10,
    args: dict[str, Any] | None = None,
    code_path: str | Path | None = None,
) -> nn.Module:
    """The model `name` for images of `channels` x `size` x `size` and `classes` classes; `args`
    (the cell's model_args) go to a library model's constructor or a user factory."""
    model_kind = kind(name)
    if model_kind == "registry":
        if args:
            raise ConfigError(f"model_args {args} apply to torchvision:, timm: and factory models, not to {name!r}")
        return model_class(name)(channels, size, classes)
    from dpstudy.models import external

    return external.build(model_kind, name, channels, size, classes, args or {}, code_path)


def cost(
    name: str, channels: int, size: int, classes: int = 10, args: dict | None = None, code_path: str | None = None
) -> dict[str, int]:
    """Parameter count and training FLOPs per sample (forward + backward, counted by torch)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    model = build(name, channels, size, classes, args, code_path)
    batch = 2  # BatchNorm needs more than one sample in training mode
    x = torch.randn(batch, channels, size, size)
    counter = FlopCounterMode(display=False)
    with counter:
        model(x).sum().backward()
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "train_flops_per_sample": counter.get_total_flops() // batch,
    }
