"""Models from outside the registry: torchvision's and timm's classification models and
transformers' causal language models with random weights, and a user's factory, each made for the
cell's task (an image's channels, size and classes; a text's vocabulary and window).

Never a download: torchvision gets weights=None, timm pretrained=False, transformers a config.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import torch.nn as nn

from dpstudy.data.task import Task
from dpstudy.models import check_vocab, check_window, hf
from dpstudy.util import refs
from dpstudy.util.errors import ConfigError

FACTORY_ARGS = ("num_classes", "in_channels", "image_size")
TEXT_FACTORY_ARGS = ("vocab_size", "seq_len")


def build(kind: str, model: str, task: Task, args: dict[str, Any], code_path: str | Path | None) -> nn.Module:
    """`model` (kind torchvision, timm, transformers or factory: dpstudy.models.kind) for `task`."""
    name = model.partition(":")[2]
    if kind == "torchvision":
        built = torchvision_model(name, task.channels, task.classes, args)
    elif kind == "timm":
        built = timm_model(name, task.channels, task.classes, args)
    elif kind == "transformers":
        built = transformers_model(name, task, args)
    else:
        built = factory_model(model, task, args, code_path)
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


class LogitsOnly(nn.Module):
    """A transformers causal LM that returns its logits tensor [B, T, vocab], as the Trainer
    expects of every model, instead of a ModelOutput; no key-value cache (training)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids, use_cache=False).logits


def transformers_model(name: str, task: Task, args: dict[str, Any]) -> nn.Module:
    """AutoModelForCausalLM.from_config(AutoConfig.for_model(name, **args), attn_implementation="sdpa"):
    random weights; the config's vocab_size the task's unless model_args set it (then at least the
    task's), its context at least the cell's seq_len."""
    transformers = hf.library()
    config = hf.config(name, args, task.vocab_size)
    check_vocab(task.vocab_size, config.vocab_size, f"transformers:{name}")
    context = hf.context_of(config)
    if context is not None:
        check_window(task.seq_len, context, f"transformers:{name}")
    try:
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    except (TypeError, ValueError) as error:  # not a causal LM, or a config that makes none
        raise ConfigError(f"transformers:{name} with model_args {args}: {type(error).__name__}: {error}") from error
    return LogitsOnly(model)


def factory_model(reference: str, task: Task, args: dict[str, Any], code_path: str | Path | None) -> nn.Module:
    """The user's factory called as factory(num_classes=, in_channels=, image_size=, **model_args)
    for images, factory(vocab_size=, seq_len=, **model_args) for text."""
    factory = refs.load(reference, code_path)
    given = (
        {"vocab_size": task.vocab_size, "seq_len": task.seq_len}
        if task.is_text
        else {"num_classes": task.classes, "in_channels": task.channels, "image_size": task.size}
    )
    check_signature(factory, reference, args, tuple(given))
    return factory(**given, **args)


def check_signature(factory, reference: str, args: dict[str, Any], given: tuple[str, ...] = FACTORY_ARGS) -> None:
    """ConfigError unless `factory` accepts the task's arguments (`given`) and the model_args."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return  # a builtin or C callable: its call will say
    wanted = ", ".join((*given, *args))
    clash = sorted(set(given) & set(args))
    if clash:
        raise ConfigError(f"factory {reference}: model_args {', '.join(clash)} are given by the data; leave them out")
    try:
        signature.bind(**dict.fromkeys(given), **args)
    except TypeError as error:
        takes = "vocab_size and seq_len" if given == TEXT_FACTORY_ARGS else "num_classes, in_channels and image_size"
        raise ConfigError(
            f"factory {reference}{signature} cannot be called with ({wanted}): {error}; a factory takes "
            f"{takes}, and the cell's model_args as keywords"
        ) from None
