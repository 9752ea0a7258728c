"""The study schema (dpstudy/study/schema.yaml): loading, validation with readable errors, defaults."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from dpstudy.study import modes
from dpstudy.util import yamlfile
from dpstudy.util.errors import ConfigError

SCHEMA_PATH = Path(__file__).with_name("schema.yaml")


@functools.cache
def schema() -> dict:
    """The schema, its mode and shard enums and their descriptions filled from the modes' table
    (dpstudy.study.modes), the one statement of what the modes are."""
    with open(SCHEMA_PATH) as f:
        loaded = yamlfile.safe_load(f)
    defs = loaded["$defs"]
    defs["mode"] = {
        "enum": list(modes.TABLE),
        "description": "; ".join(f"{m.name}: {m.description}" for m in modes.TABLE.values()) + ".",
    }
    sharded = [(m, s) for m in modes.TABLE.values() for s in m.schemes if s.shard != modes.NO_SHARD]
    defs["shard"] = {
        **defs["shard"],
        "enum": list(modes.SHARDS),
        "description": (
            "How a cell of a sharding mode spreads the model over its devices: "
            + "; ".join(f"{m.name} {s.shard} ({s.description})" for m, s in sharded)
            + ". A cell without it takes its mode's first ("
            + ", ".join(
                f"{m.name}: {m.default_shard}" for m in modes.TABLE.values() if m.default_shard != modes.NO_SHARD
            )
            + "); the other modes take none. In the cell id only where a sweep sets it."
        ),
    }
    for ref, knob in (("settings", lambda k: {**modes.KNOBS[k], "default": None}), ("spec", reference)):
        defs[ref]["properties"] = after(defs[ref]["properties"], "seed", {k: knob(k) for k in modes.KNOBS})
    return loaded


def reference(key: str) -> dict:
    return {"$ref": f"#/$defs/settings/properties/{key}"}


def after(properties: dict, key: str, more: dict) -> dict:
    """`properties` with `more` inserted after `key` (the order the reference and the tables show)."""
    out = {}
    for name, value in properties.items():
        out[name] = value
        if name == key:
            out.update(more)
    return out


@functools.cache
def validator(ref: str | None = None) -> Draft202012Validator:
    """A validator for the whole schema, or for one of its $defs (e.g. ref='spec').

    The local $refs are inlined first: a study of a thousand cells validates a thousand specs,
    and following references costs jsonschema more than the checks themselves."""
    return Draft202012Validator(inline(schema()["$defs"][ref] if ref else schema()))


def inline(node: Any) -> Any:
    """`node` with every local #/$defs/... reference replaced by what it points to."""
    if isinstance(node, dict):
        node = resolve(node) if "$ref" in node else node
        return {k: inline(v) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [inline(v) for v in node]
    return node


# Keys a study had before they were renamed, and their names now: an old study gets told.
RENAMED = {"predict": "forecast"}


def check(instance: Any, ref: str | None = None, where: str = "") -> None:
    """Raise ConfigError naming the offending key path when `instance` breaks the schema."""
    if ref is not None and valid_by_keys(instance, ref):
        return
    errors = list(validator(ref).iter_errors(instance))
    if not errors:
        return
    error = best_match(errors)
    path = ".".join(str(p) for p in error.absolute_path) or "(top level)"
    if error.validator == "additionalProperties":
        unknown = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        renamed = "".join(f" ({key!r} is now {RENAMED[key]!r})" for key in unknown if key in RENAMED)
        raise ConfigError(f"{where}unknown key {', '.join(map(repr, unknown))} at {path}{renamed}")
    raise ConfigError(f"{where}{path}: {error.message}")


# The keywords of a $def whose keys are valid or not each on its own (no keyword relates two keys).
KEYWISE = {"type", "properties", "additionalProperties", "required", "description"}


@functools.cache
def keywise(ref: str) -> bool:
    node = schema()["$defs"][ref]
    return set(node) <= KEYWISE and node.get("type") == "object" and node.get("additionalProperties") is False


@functools.lru_cache(maxsize=1 << 16)
def valid_value(ref: str, key: str, value: tuple) -> bool:
    kind, data = value
    return property_validator(ref, key).is_valid(json.loads(data) if kind == "json" else data)


SCALARS = (str, int, float, bool, type(None))


def value_key(value: Any) -> tuple:
    """A hashable stand-in for a value, its type kept (True is not 1 to JSON Schema). ValueError for
    what is not JSON (a tuple is no JSON array)."""
    if type(value) in SCALARS:
        return (type(value).__name__, value)
    text = json.dumps(value, sort_keys=True)  # TypeError: not JSON
    if json.loads(text) != value:
        raise ValueError(value)
    return ("json", text)


def valid_by_keys(instance: Any, ref: str) -> bool:
    """Whether `instance` is a valid $defs/<ref>, judged one key at a time and each (key, value)
    judged once: the thousands of cells of a study share a few values per key, and every job step
    of a cluster run parses the whole study again. False also where it cannot tell (check() then
    runs the full validation, and its message)."""
    if not keywise(ref) or not isinstance(instance, dict):
        return False
    node = schema()["$defs"][ref]
    if not set(node.get("required", ())) <= instance.keys() or not instance.keys() <= node["properties"].keys():
        return False
    try:
        return all(valid_value(ref, key, value_key(value)) for key, value in instance.items())
    except (TypeError, ValueError):  # not JSON: the validator says why
        return False


@functools.cache
def property_validator(ref: str, key: str) -> Draft202012Validator:
    return Draft202012Validator(inline(schema()["$defs"][ref]["properties"][key]))


def check_property(ref: str, key: str, value: Any, where: str = "") -> None:
    """Raise ConfigError when `value` is not a valid `key` of $defs/<ref>, naming both."""
    errors = list(property_validator(ref, key).iter_errors(value))
    if errors:
        raise ConfigError(f"{where}{key}: {best_match(errors).message}")


def resolve(node: dict) -> dict:
    """Follow local $refs (#/$defs/...) until a node without one."""
    while "$ref" in node:
        target: Any = schema()
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


@functools.cache
def _defaults(ref: str) -> tuple:
    properties = schema()["$defs"][ref]["properties"]
    return tuple((k, resolve(v)["default"]) for k, v in properties.items() if "default" in resolve(v))


def defaults(ref: str) -> dict:
    """{key: default} for every property of $defs/<ref> that documents one."""
    return dict(_defaults(ref))


def property_names(ref: str) -> list[str]:
    return list(schema()["$defs"][ref]["properties"])
