"""Two validators of one schema give one verdict. collect reads records through fastjsonschema
(draft 7 semantics, dpstudy.analysis.records.quick_check) and only words its rejections with
jsonschema's Draft202012Validator, the validator RECORD_SCHEMA is written for: a record the quick
check accepted and jsonschema would reject would enter the tables unchecked. So both judge the
helpers' valid records and every mutation of them made by walking the schema: at each path, values
of the wrong type (booleans, nulls, strings, lists, objects, floats where integers are required,
NaN), the schema's own edge values (each enum member and one outside, the const and another,
the minimum and below it), every key removed, a key the schema does not name added to every
object, and the optional fields it names inserted with good and bad values."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import fastjsonschema
import pytest
from helpers.records import REPLICA, SHARD, make_record, make_util, small_grid, strategy_grid
from jsonschema import Draft202012Validator

from dpstudy.analysis.records import quick_check
from dpstudy.record import fields as record

Where = tuple[str | int, ...]  # a path into a record: keys and list indices
# Replacements tried at every path: each is the wrong type somewhere in the schema.
WRONG = (None, True, False, 0, 1, -1, 2.0, 0.5, -2.5, math.nan, 10**20, "", "x", [], [1.0], ["x"], {}, {"a": 1})
# Values for the optional fields the schema names but a record lacks: a good one and bad ones.
INSERTED = (0.5, 3, None, True, "x", [], {})
DDP_PROBE = {"steps": 8, "sync_step_s": 0.045, "nosync_step_s": 0.035, "allreduce_s": 0.02, "grad_bytes": 400_000}
FSDP_PROBE = {
    "steps": 2,
    "sync_step_s": 0.05,
    "nosync_step_s": 0.035,
    "allgather_s": 0.006,
    "reduce_scatter_s": 0.008,
    "gather_bytes": 200_000,
    "grad_bytes": 400_000.0,  # a whole float is an integer in both drafts
    "units": 4,
    "graphs_compiled": 0,
}
DP_PROBE = {"steps": 8, "scatter_s": 0.001, "replicate_s": 0.002, "gather_s": 0.0015}


def with_optional_fields(rec: dict[str, Any]) -> dict[str, Any]:
    """`rec` with every optional epoch and summary field the schema names."""
    for e in rec["epochs"]:
        e.update(steady_s=1.0, steady_samples=500, other_load=0.2, compile_s=0.3, eval_compile_s=0.1)
    rec["summary"]["compile_s"] = 0.4
    return rec


def bases() -> list[dict[str, Any]]:
    """Valid records of every shape: statuses, modes and their probes, memory, util, optional fields."""
    return [
        make_record(mode="single"),
        make_record("skipped", mode="dp", gpus=2, reason="dp needs CUDA"),
        make_record("oom", mode="ddp", gpus=2, backend="gloo", reason="rank 0: OutOfMemoryError"),
        make_record(
            mode="ddp", gpus=2, backend="nccl", device="cuda", util=make_util(2, [60.0, 58.0]), probe=DDP_PROBE
        ),
        make_record(mode="fsdp", shard="full", gpus=2, backend="gloo", probe=FSDP_PROBE, memory=[SHARD] * 2),
        make_record(mode="dp", gpus=2, device="cuda", probe=DP_PROBE, memory=[REPLICA] * 2),
        with_optional_fields(make_record(mode="single", compile=True, memory=[REPLICA])),
    ]


def fast_accepts(rec: Any) -> bool:
    try:
        quick_check()(rec)
    except fastjsonschema.JsonSchemaException:
        return False
    return True


JSONSCHEMA = Draft202012Validator(record.RECORD_SCHEMA)


def child_schema(schema: dict[str, Any] | None, key: str | int) -> dict[str, Any] | None:
    """The schema that governs `key` of a value under `schema`, if the schema says anything."""
    if not schema:
        return None
    if isinstance(key, int):
        return schema.get("items")
    if key in schema.get("properties", {}):
        return schema["properties"][key]
    extra = schema.get("additionalProperties")
    return extra if isinstance(extra, dict) else None


def edge_values(schema: dict[str, Any] | None) -> list[Any]:
    """The values the schema's own keywords draw a line at."""
    if not schema:
        return []
    values: list[Any] = []
    if "enum" in schema:
        values += [*schema["enum"], "not-in-enum"]
    if "const" in schema:
        values += [schema["const"], f"{schema['const']}-other"]
    if "minimum" in schema:
        low = schema["minimum"]
        values += [low, low - 1, low - 0.5, low + 0.5]
    return values


def node_mutations(value: Any, schema: dict[str, Any] | None, path: Where) -> Iterator[tuple[Where, str, Any]]:
    """(path, what, replacement) for the value at `path`, then for the values under it."""
    for wrong in [*WRONG, *edge_values(schema)]:
        yield path, f"= {wrong!r}", wrong
    if isinstance(value, dict):
        for key in value:
            yield path, f"without {key!r}", {k: v for k, v in value.items() if k != key}
        yield path, "with an unknown key", {**value, "unknown": 1.0}
        for key in (schema or {}).get("properties", {}):
            if key not in value:
                for inserted in INSERTED:
                    yield path, f"with {key!r} = {inserted!r}", {**value, key: inserted}
        children = [k for k in value if child_schema(schema, k) is not None]
    elif isinstance(value, list):
        yield path, "emptied", []
        for item in (None, "x", True, 1.5, {}, []):
            yield path, f"+ [{item!r}]", [*value, item]
        children = [0] if value and child_schema(schema, 0) is not None else []  # items share one schema
    else:
        children = []
    for key in children:
        yield from node_mutations(value[key], child_schema(schema, key), (*path, key))


def replaced(rec: dict[str, Any], path: Where, new: Any) -> Any:
    """A copy of `rec` as JSON would carry it, with the value at `path` replaced by `new`."""
    if not path:
        return json.loads(json.dumps(new))
    copy = json.loads(json.dumps(rec))
    parent = copy
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = json.loads(json.dumps(new))
    return copy


def verdicts() -> tuple[list[str], int, int]:
    """(disagreements, records judged, rejected by both) over every base record and mutation."""
    disagreements, seen, rejected = [], set(), 0
    for base in bases():
        for path, what, new in node_mutations(base, record.RECORD_SCHEMA, ()):
            rec = replaced(base, path, new)
            text = json.dumps(rec, sort_keys=True)
            if text in seen:
                continue
            seen.add(text)
            fast, slow = fast_accepts(rec), JSONSCHEMA.is_valid(rec)
            rejected += not slow
            if fast != slow:
                where = "/".join(map(str, path)) or "(record)"
                disagreements.append(f"{base['cell']} {where} {what}: fastjsonschema {fast}, jsonschema {slow}")
    return disagreements, len(seen), rejected


def test_the_helpers_records_are_valid_to_both():
    for rec in [*bases(), *small_grid(), *strategy_grid()]:
        assert fast_accepts(rec) and JSONSCHEMA.is_valid(rec), rec["cell"]


def test_fastjsonschema_and_jsonschema_agree_on_every_mutation():
    disagreements, judged, rejected = verdicts()
    assert disagreements == []
    # meaningful: thousands of records, most broken, and many mutations that stay valid
    assert judged > 3000 and rejected > judged / 2 and judged - rejected > 500


@pytest.mark.parametrize(
    "path,value",
    [
        (("epochs", 0, "epoch"), True),  # a boolean is not an integer
        (("epochs", 0, "wall_s"), False),  # nor a number
        (("epochs", 0, "samples"), 1.5),
        (("epochs", 0, "epoch"), 0),  # minimum 1
        (("summary", "total_s"), "1.0"),
        (("status",), "done"),
        (("schema",), "dpstudy.record/2"),
        (("probe", "units"), 2.5),
        (("probe", "overlap"), 0.5),  # not a probe field
        (("memory", "peak_mb"), [True]),
    ],
)
def test_what_both_reject(path, value):
    rec = replaced(bases()[4], path, value)
    assert not fast_accepts(rec) and not JSONSCHEMA.is_valid(rec)
