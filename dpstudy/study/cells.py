"""Cell ids (docs/design.md, Cells): readable, stable, one per distinct setting of the study."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def value_token(value: Any) -> str:
    """A setting's value as it appears in an id: booleans as 0/1, floats without a dot."""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, float):
        return format(value, "g").replace(".", "p").replace("-", "m").replace("+", "")
    return str(value)


# The keys every id spells out (base_id); other keys appear only where a sweep sets them.
ID_KEYS = ("dataset", "model", "mode", "gpus", "nodes", "batch", "backend")
# Keys of one mode only (fsdp's shard): left out of the id of a cell whose mode does not take them,
# where they are 'none', so that a ddp cell in a grid with fsdp shardings keeps its plain id.
MODE_ONLY_KEYS = ("shard",)


def base_id(spec: dict[str, Any]) -> str:
    """{dataset}-{model}-{mode}-g{gpus}-b{batch}-{backend}, then -nodes{n} for a multi-node cell."""
    nodes = spec.get("nodes", 1)
    return "{dataset}-{model}-{mode}-g{gpus}-b{batch}-{backend}".format(**spec) + (
        f"-nodes{nodes}" if nodes > 1 else ""
    )


def cell_id(spec: dict[str, Any], varied: Iterable[str] = (), repeats: int = 1) -> str:
    """base id, then -{key}{value} for every other varied key (sorted), then -r{k} with repeats."""
    parts = [base_id(spec)]
    keys = sorted(k for k in set(varied) - set(ID_KEYS) if not (k in MODE_ONLY_KEYS and spec[k] == "none"))
    parts += [f"{key}{value_token(spec[key])}" for key in keys]
    if repeats > 1:
        parts.append(f"r{spec['repeat']}")
    return "-".join(parts)
