"""record.json's probe: its fields are defined once (PROBE_FIELDS), the schema made from them."""

from __future__ import annotations

import pytest
from helpers.records import make_record
from jsonschema import ValidationError

from dpstudy.record import fields as record


def test_the_schemas_probe_is_the_probe_fields():
    probe = record.RECORD_SCHEMA["properties"]["probe"]
    assert probe["properties"] is record.PROBE_FIELDS and probe["additionalProperties"] is False
    for name, field in record.PROBE_FIELDS.items():
        assert field["type"] in ("number", "integer") and field["description"], name
    # counts and sizes are whole numbers, everything else seconds
    integers = {name for name, field in record.PROBE_FIELDS.items() if field["type"] == "integer"}
    assert integers == {
        "steps",
        "rounds",
        "grad_bytes",
        "gather_bytes",
        "units",
        "buckets",
        "gathers",
        "graphs_compiled",
    }
    assert all(name.endswith("_s") for name in record.PROBE_FIELDS.keys() - integers)


def test_a_probe_field_the_definition_lacks_or_of_another_type_is_invalid():
    valid = {"steps": 8, "sync_step_s": 0.045, "nosync_step_s": 0.035, "allreduce_s": 0.02, "grad_bytes": 400_000}
    record.validate(make_record(mode="ddp", gpus=2, backend="gloo", probe=valid))
    for probe in ({**valid, "overlap": 0.5}, {**valid, "steps": 2.5}, {**valid, "allreduce_s": True}):
        with pytest.raises(ValidationError):
            make_record(mode="ddp", gpus=2, backend="gloo", probe=probe)
