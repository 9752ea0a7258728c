"""Models from outside the registry: torchvision's and timm's classification models with random
weights, and a user's factory, each made for the dataset's channels, size and classes.

Never a download: torchvision gets weights=None, timm pretrained=False.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import torch.nn as nn

from dpstudy.util import refs
from dpstudy.util.errors import ConfigError

FACTORY_ARGS = ("num_classes", "in_channels", "image_size")


def build(
    kind: str,
    model: str,
    channels: int,
    size: int,
    classes: int,
    args: dict[str, Any],
    code_path: str | Path | None,
) -> nn.Module:
    """`model` (kind torchvision, timm or factory: dpstudy.models.kind) for the dataset."""
    name = model.partition(":")[2]
    if kind == "torchvision":
        built = torchvision_model(name, channels, classes, args)
    elif kind == "timm":
        built = timm_model(name, channels, classes, args)
    else:
        built = factory_model(model, channels, size, classes, args, code_path)
    if not isinstance(built, nn.Module):
        raise ConfigError(f"model {model!r} gave a {type(built).__name__}, not a torch.nn.Module")
    return built


def torchvision_model(name: str, channels: int, classes: int, args: dict[str, Any]) -> nn.Module:
    """torchvision.models.get_model(name, weights=None, num_classes=classes, **args), its first
    3-channel convolution made for `channels`."""
    import torchvision

    known = torchvision.models.list_models(module=torchvision.models)  # the classification models
    if name not in known:
        raise ConfigError(f"torchvision has no classification model {name!r}; it has {', '.join(known)}")
    try:
        model = torchvision.models.get_model(name, weights=None, num_classes=classes, **args)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"torchvision:{name} with model_args {args}: {error}") from error
    if channels != 3:
        first_conv_for(model, channels, f"torchvision:{name}")
    return model


def first_conv_for(model: nn.Module, channels: int, what: str) -> None:
    """Replace the first convolution that takes 3 channels by one that takes `channels` (same
    kernel, stride, padding, ...; fresh weights): torchvision's models are written for RGB."""
    for parent in model.modules():
        for child_name, child in parent.named_children():
            if isinstance(child, nn.Conv2d) and child.in_channels == 3:
                setattr(parent, child_name, conv_like(child, channels))
                return
    raise ConfigError(f"{what}: no 3-channel convolution to adapt to {channels} input channels")


def conv_like(conv: nn.Conv2d, channels: int) -> nn.Conv2d:
    return nn.Conv2d(
        channels,
        conv.out_channels,
        conv.kernel_size,
        stride=conv.stride,
        padding=conv.padding,
        dilation=conv.dilation,
        groups=conv.groups,
        bias=conv.bias is not None,
        padding_mode=conv.padding_mode,
    )


def timm_model(name: str, channels: int, classes: int, args: dict[str, Any]) -> nn.Module:
    """timm.create_model(name, pretrained=False, num_classes=classes, in_chans=channels, **args)."""
    try:
        import timm
    except ImportError as error:
        raise ConfigError(
            f"model timm:{name} needs timm, an optional dependency: pip install 'dpstudy[timm]' "
            "(make setup installs it)"
        ) from error
    if not timm.is_model(name.split(".")[0]):
        close = timm.list_models(f"*{name.split('.')[0][:6]}*")[:8]
        raise ConfigError(f"timm has no model {name!r}" + (f"; similar: {', '.join(close)}" if close else ""))
    try:
        return timm.create_model(name, pretrained=False, num_classes=classes, in_chans=channels, **args)
    except (TypeError, ValueError, AssertionError) as error:
        raise ConfigError(f"timm:{name} with model_args {args}: {type(error).__name__}: {error}") from error


def factory_model(
    reference: str, channels: int, size: int, classes: int, args: dict[str, Any], code_path: str | Path | None
) -> nn.Module:
    """The user's factory called as factory(num_classes=, in_channels=, image_size=, **model_args)."""
    factory = refs.load(reference, code_path)
    check_signature(factory, reference, args)
    return factory(num_classes=classes, in_channels=channels, image_size=size, **args)


def check_signature(factory, reference: str, args: dict[str, Any]) -> None:
    """ConfigError unless `factory` accepts the three dataset arguments and the model_args."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return  # a builtin or C callable: its call will say
    try:
        signature.bind(**dict.fromkeys(FACTORY_ARGS), **args)
    except TypeError as error:
        wanted = ", ".join((*FACTORY_ARGS, *args))
        raise ConfigError(
            f"factory {reference}{signature} cannot be called with ({wanted}): {error}; a factory takes "
            "num_classes, in_channels and image_size, and the cell's model_args as keywords"
        ) from None
