"""The models a study can name, each built for a cell's task (dpstudy.data.task: images or text):

  a registry name       every model of the source reports, and gpt (MODELS)
  torchvision:<name>    a classification model of torchvision.models, random weights
  timm:<name>           a model of timm (optional dependency: pip install dpstudy[timm]), random weights
  transformers:<name>   a causal language model of Hugging Face transformers (optional dependency: pip
                        install dpstudy[transformers]) built from its config, random weights; model_args
                        override config fields
  <module>:<callable>   a factory of the user's, importable from the study's code_path or the Python
                        path, called with keywords: for images num_classes, in_channels, image_size; for
                        text vocab_size (the tokenizer's symbols) and seq_len (tokens per input); then
                        the cell's model_args. An image model returns [B, num_classes] logits, a
                        language model [B, seq_len, vocab_size] (one per symbol at every position).

The registry names import paths rather than classes so that reading it (the Snakefile does,
for validation) does not import torch; so does everything here but build, cost and a
transformers: model's context_length (transformers imports torch).
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpstudy.data.task import IMAGE, TEXT
from dpstudy.models import gpt_config
from dpstudy.util import refs
from dpstudy.util.errors import ConfigError
from dpstudy.util.hashing import tree_sha256

if TYPE_CHECKING:
    import torch.nn as nn

    from dpstudy.data.task import Task


@dataclass(frozen=True)
class ModelInfo:
    name: str
    target: str  # "module:Class": an image model's class takes (channels, size, classes, **model_args),
    # a text model's (vocab_size, seq_len, **model_args)
    source: str  # which source report (or issue) it reproduces
    needs_ext: bool = False  # uses the project's C++/CUDA extension
    task: str = IMAGE  # the task kind it is for (dpstudy.data.task)
    args: tuple[str, ...] = ()  # the model_args it accepts
    positive: tuple[str, ...] = ()  # of them, those that must be positive integers (checked before any job)


MODELS: dict[str, ModelInfo] = {
    m.name: m
    for m in (
        ModelInfo("lenet", "dpstudy.models.lenet:LeNet", "000 exp 1"),
        ModelInfo("lenet_ext", "dpstudy.models.lenet_ext:LeNetExt", "002 task 3", needs_ext=True),
        ModelInfo("vgg_bn", "dpstudy.models.vgg:VGGBN", "000 exp 2"),
        ModelInfo("vgg19", "dpstudy.models.vgg:VGG19", "001"),
        ModelInfo("resnet18", "dpstudy.models.resnet:ResNet18", "003", args=("width",), positive=("width",)),
        ModelInfo("simplecnn", "dpstudy.models.simplecnn:SimpleCNN", "004 Q2"),
        ModelInfo("vit", "dpstudy.models.vit:ViT", "issue 16"),
        ModelInfo("gpt", "dpstudy.models.gpt:GPT", "issue 50", task=TEXT, args=gpt_config.ARGS),
    )
}


# `<library>:<name>` models, built by dpstudy.models.external (timm names may carry a .tag)
LIBRARIES = ("torchvision", "timm", "transformers")
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
        f"model {model!r} is not one of {sorted(MODELS)}, torchvision:<name>, timm:<name>, "
        "transformers:<name> or a factory <module>:<callable>"
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


def task_kind(model: str) -> str | None:
    """The task `model` is for: image (image registry models, torchvision:, timm:) or text (text
    registry models, transformers:); None for a factory, known only once it is built."""
    model_kind = kind(model)
    if model_kind == "registry":
        return MODELS[model].task
    return {"torchvision": IMAGE, "timm": IMAGE, "transformers": TEXT}.get(model_kind)


def context_length(model: str, args: dict[str, Any] | None = None) -> int | None:
    """The longest input a text model takes: gpt's model_args seq_len or its size's, a transformers
    model's n_positions or max_position_embeddings after the model_args; None when unknown (an
    image model, a factory)."""
    model_kind = kind(model)
    if model == "gpt":
        return gpt_config.resolve(args).seq_len
    if model_kind == "transformers":
        from dpstudy.models import hf

        return hf.context_of(hf.config(model.partition(":")[2], args or {}))
    return None


def window(spec: dict[str, Any]) -> int:
    """A text cell's seq_len: the spec's when set, else its model's context length; ConfigError when
    the spec's is longer than the context, or when neither is known."""
    seq_len, context = spec.get("seq_len"), context_length(spec["model"], spec.get("model_args"))
    if seq_len is None:
        if context is None:
            raise ConfigError(f"model {spec['model']!r} has no known context length: set seq_len")
        return context
    if context is not None:
        check_window(seq_len, context, spec["model"])
    return seq_len


def check_vocab(task_vocab: int, model_vocab: int, model: str) -> None:
    """ConfigError when a text model has fewer symbols than the data's tokenizer: an id past its
    embedding table would fail in the middle of training."""
    if model_vocab < task_vocab:
        raise ConfigError(
            f"model {model!r}: the tokenizer has {task_vocab} symbols but model_args vocab_size is {model_vocab}"
        )


def check_window(seq_len: int, context: int, model: str) -> None:
    """ConfigError when a cell's seq_len is longer than its model's context length."""
    if seq_len > context:
        raise ConfigError(
            f"model {model!r}: seq_len {seq_len} exceeds its context length {context}; "
            "set a smaller seq_len, or a longer context in model_args"
        )


def check_args(name: str, args: dict[str, Any] | None, where: str = "") -> None:
    """ConfigError for a registry model's model_args key it does not accept, naming the ones it does."""
    accepted = MODELS[name].args
    unknown = sorted(set(args or {}) - set(accepted))
    if unknown:
        raise ConfigError(
            f"{where}model {name!r} takes no model_args {', '.join(map(repr, unknown))}: "
            f"it accepts {', '.join(accepted) or 'none'}"
        )
    for key in MODELS[name].positive:
        value = (args or {}).get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"{where}model {name!r}: model_args {key} {value!r} is not a positive integer")


def build(name: str, task: Task, args: dict[str, Any] | None = None, code_path: str | Path | None = None) -> nn.Module:
    """The model `name` for `task` (dpstudy.data.task): images of task.channels x task.size x
    task.size into task.classes, or text of task.vocab_size symbols in windows of task.seq_len;
    `args` are the cell's model_args."""
    expected = task_kind(name)
    if expected is not None and expected != task.kind:
        raise ConfigError(f"model {name!r} is for {expected} data; this cell's data is {task.kind}")
    if kind(name) == "registry":
        check_args(name, args)
        if task.is_text:
            return model_class(name)(task.vocab_size, task.seq_len, **(args or {}))
        return model_class(name)(task.channels, task.size, task.classes, **(args or {}))
    from dpstudy.models import external

    return external.build(kind(name), name, task, args or {}, code_path)


def cost(
    name: str, task: Task, args: dict[str, Any] | None = None, code_path: str | Path | None = None
) -> dict[str, int]:
    """Parameter count and training FLOPs per sample (forward, loss and backward as torch's FLOP
    counter counts them, on the meta device: dpstudy.models.flops)."""
    from dpstudy.models import flops

    return flops.cost(lambda: build(name, task, args, code_path), task)
