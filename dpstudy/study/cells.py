"""Cell ids (docs/design.md, Cells): readable, stable, one per distinct setting of the study."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from dpstudy import models
from dpstudy.data.user import folder_name
from dpstudy.study import modes
from dpstudy.util import refs

LONGEST_TOKEN = 40  # a longer value (a dict of model_args) is cut and a hash of it appended


def value_token(value: Any) -> str:
    """A setting's value as it appears in an id: booleans as 0/1, floats without a dot, a dict
    (model_args) as its sorted keys and values (depth2_width32), anything else made safe."""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, float):
        return format(value, "g").replace(".", "p").replace("-", "m").replace("+", "")
    if isinstance(value, dict):
        text = "_".join(f"{refs.safe_token(str(k))}{value_token(v)}" for k, v in sorted(value.items())) or "none"
        if len(text) > LONGEST_TOKEN:
            digest = hashlib.sha1(json.dumps(value, sort_keys=True).encode()).hexdigest()[:6]
            text = f"{text[: LONGEST_TOKEN - 7]}_{digest}"
        return text
    if isinstance(value, str):
        return refs.safe_token(value)
    if isinstance(value, list | tuple):
        return "_".join(value_token(v) for v in value)
    return str(value)


# The keys every id spells out (base_id); other keys appear only where a sweep sets them.
ID_KEYS = ("dataset", "model", "mode", "gpus", "nodes", "batch", "backend")
# Keys of one mode or shard only (a sharding mode's shard, ddp's knobs, hybrid's replicate): left
# out of the id of a cell whose mode does not take them, where they are 'none' or None, so that a
# ddp cell in a grid with fsdp shardings keeps its plain id.
MODE_ONLY_KEYS = ("shard", *modes.knobs())


def base_id(spec: dict[str, Any]) -> str:
    """{dataset}-{model}-{mode}-g{gpus}-b{batch}-{backend}, then -nodes{n} for a multi-node cell.
    A user's dataset function and a model outside the registry appear as their tokens
    (timm_convnext_atto, make_net_3fa2c1)."""
    nodes = spec.get("nodes", 1)
    names = {"dataset": folder_name(spec["dataset"]), "model": models.token(spec["model"])}
    return "{dataset}-{model}-{mode}-g{gpus}-b{batch}-{backend}".format(**{**spec, **names}) + (
        f"-nodes{nodes}" if nodes > 1 else ""
    )


def cell_id(spec: dict[str, Any], varied: Iterable[str] = (), repeats: int = 1) -> str:
    """base id, then -{key}{value} for every other varied key (sorted), then -r{k} with repeats."""
    parts = [base_id(spec)]
    keys = sorted(k for k in set(varied) - set(ID_KEYS) if not (k in MODE_ONLY_KEYS and spec[k] in ("none", None)))
    parts += [f"{key}{value_token(spec[key])}" for key in keys]
    if repeats > 1:
        parts.append(f"r{spec['repeat']}")
    return "-".join(parts)
