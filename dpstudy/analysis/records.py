"""record.json files -> validated records, the first step of dpstudy.analysis.collect.

A study holds thousands of records and every one is validated against RECORD_SCHEMA
(dpstudy/record/fields.py): by a compiled validator, and by jsonschema only to word the error of
one it rejects.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import fastjsonschema
from jsonschema import ValidationError

from dpstudy.record import fields as record


class RecordError(ValueError):
    """A record that cannot be read; the message names the file."""


@functools.cache
def quick_check():
    """RECORD_SCHEMA compiled to Python by fastjsonschema. jsonschema walks the schema anew for every
    record, about 1 ms each: a 3,000-cell study paid seconds for it. A record the quick check rejects
    goes on to jsonschema, so only one it accepts matters: the keywords the schema uses (type,
    required, properties, items, minimum, const, enum, additionalProperties) mean the same in draft 7,
    which fastjsonschema implements, as in 2020-12 (booleans are not numbers in either; a float with
    no fractional part is an integer in both). tests/unit/analysis/test_record_validation.py holds
    the two to the same verdicts on valid records and thousands of broken ones."""
    return fastjsonschema.compile({k: v for k, v in record.RECORD_SCHEMA.items() if k != "$schema"})


def read_record(path: str) -> dict[str, Any]:
    """record.read, validated faster: a record the quick check passes is valid; any other is
    validated by jsonschema as record.read does, which raises its ValidationError (same message)."""
    with open(path) as f:
        rec = json.load(f)
    try:
        quick_check()(rec)
    except fastjsonschema.JsonSchemaException:
        record.validate(rec)  # rejects it, and words the error
    return rec


def rerun_hint(path: str) -> str:
    return f"rerun exactly that cell with `snakemake --cores 1 --forcerun {path}`"


def read_records(paths: Iterable[str | Path], unreadable: list[str] | None = None) -> list[tuple[str, dict[str, Any]]]:
    """(path, record) for every path, validated. An unreadable one (truncated, edited by hand)
    raises RecordError naming it and how to rerun it; with `unreadable` (a list) it is appended
    there as that message instead, and the other records are read."""
    records, seen = [], {}
    for path in map(str, paths):
        try:
            rec = read_record(path)
        except (OSError, json.JSONDecodeError, ValidationError) as e:
            detail = e.message if isinstance(e, ValidationError) else str(e)
            message = f"{path}: not a valid record: {detail}; {rerun_hint(path)}"
            if unreadable is None:
                raise RecordError(message) from None
            unreadable.append(message)
            continue
        if rec["cell"] in seen:
            raise RecordError(f"{path}: cell {rec['cell']!r} already came from {seen[rec['cell']]}")
        seen[rec["cell"]] = path
        records.append((path, rec))
    return records
