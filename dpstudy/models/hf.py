"""`transformers:<name>` models' configs: Hugging Face's config class for the model type `name`
(a key of transformers' CONFIG_MAPPING: gpt2, llama, ...), its fields overridden by model_args.
Never a download: AutoConfig.for_model makes the class's defaults, and the model is built from it
with random weights (dpstudy.models.external.transformers_model).

transformers is imported when a function here is called (it imports torch).
"""

from __future__ import annotations

import difflib
from typing import Any

from dpstudy.util.errors import ConfigError

CONTEXT_FIELDS = ("n_positions", "max_position_embeddings")  # where configs keep the context length
SPECIAL_TOKENS = ("bos_token_id", "eos_token_id", "pad_token_id")
INSTALL = "pip install 'dpstudy[transformers]'"


def library():
    try:
        import transformers
    except ImportError as error:
        raise ConfigError(
            f"transformers: models need transformers, an optional dependency: install the transformers "
            f"extra ({INSTALL}; make setup installs it)"
        ) from error
    return transformers


def config(name: str, args: dict[str, Any], vocab_size: int | None = None):
    """The config of model type `name` with `args` applied; vocab_size (the task's) unless args
    set it. ConfigError for an unknown type, naming the close ones, or an unknown field."""
    transformers = library()
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    known = list(CONFIG_MAPPING.keys())
    if name not in known:
        close = difflib.get_close_matches(name, known, n=8, cutoff=0.5)
        hint = f"; close: {', '.join(close)}" if close else "; transformers.CONFIG_MAPPING lists them"
        raise ConfigError(f"transformers has no model type {name!r}{hint}")
    defaults = transformers.AutoConfig.for_model(name)
    # for_model sets any keyword as an attribute: a misspelt field would be silently ignored
    fields = set(defaults.to_dict()) | set(getattr(defaults, "attribute_map", {}))
    unknown = sorted(set(args) - fields)
    if unknown:
        close = {k: difflib.get_close_matches(k, sorted(fields), n=3) for k in unknown}
        named = "; ".join(f"{k} (close: {', '.join(c)})" if c else k for k, c in close.items())
        raise ConfigError(f"transformers:{name}: model_args: {type(defaults).__name__} has no field {named}")
    overrides = dict(args) if vocab_size is None else {"vocab_size": vocab_size, **args}
    # the data's tokenizer has its own special symbols: the config's past its vocabulary (gpt2's
    # 50256 over a smaller one) mean nothing to training, and transformers warns of them
    vocab = overrides.get("vocab_size", getattr(defaults, "vocab_size", None))
    for key in SPECIAL_TOKENS:
        value = getattr(defaults, key, None)
        if key not in args and isinstance(vocab, int) and isinstance(value, int) and value >= vocab:
            overrides[key] = None
    try:
        return transformers.AutoConfig.for_model(name, **overrides)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"transformers:{name} with model_args {args}: {error}") from error


def context_of(config) -> int | None:
    """The longest input the config's position embeddings allow, or None when it names none."""
    for field in CONTEXT_FIELDS:
        value = getattr(config, field, None)
        if isinstance(value, int):
            return value
    return None
