"""The shape of `gpt` (dpstudy.models.gpt) from a cell's model_args, without torch: planning reads
a text model's context length (dpstudy.models.context_length) before any job.

A named `size` gives every dimension; the other model_args override it one by one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dpstudy.util.errors import ConfigError


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int
    n_head: int
    d_model: int
    seq_len: int  # context length: rows of the position table
    vocab_size: int | None = None  # None: the task's
    dropout: float = 0.0


SIZES: dict[str, GPTConfig] = {
    "tiny": GPTConfig(2, 2, 64, 128),  # the CPU tests' model
    "mini": GPTConfig(4, 4, 256, 256),
    "half": GPTConfig(6, 6, 384, 512),  # half GPT-2 small's depth, width and context
    "gpt2": GPTConfig(12, 12, 768, 1024),  # GPT-2 small: 124M parameters with its 50257 symbols
}
DEFAULT_SIZE = "tiny"
ARGS = ("size", "n_layer", "n_head", "d_model", "seq_len", "vocab_size", "dropout")
DIMENSIONS = ("n_layer", "n_head", "d_model", "seq_len", "vocab_size")


def resolve(args: dict[str, Any] | None) -> GPTConfig:
    """The model_args' GPTConfig: the named size's, each given key overriding it; ConfigError for
    an unknown key, size or a value that makes no model."""
    args = dict(args or {})
    unknown = sorted(set(args) - set(ARGS))
    if unknown:
        named = ", ".join(map(repr, unknown))
        raise ConfigError(f"model 'gpt' takes no model_args {named}: it accepts {', '.join(ARGS)}")
    size = args.pop("size", DEFAULT_SIZE)
    if size not in SIZES:
        raise ConfigError(f"model 'gpt': model_args size {size!r} is not one of {', '.join(SIZES)}")
    for key in DIMENSIONS:
        value = args.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"model 'gpt': model_args {key} {value!r} is not a positive integer")
    dropout = args.get("dropout", 0.0)
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise ConfigError(f"model 'gpt': model_args dropout {dropout!r} is not in [0, 1)")
    config = GPTConfig(**{**vars(SIZES[size]), **{k: v for k, v in args.items() if v is not None}})
    if config.d_model % config.n_head:
        raise ConfigError(
            f"model 'gpt': d_model {config.d_model} is not divisible by n_head {config.n_head} (model_args {args})"
        )
    return config
