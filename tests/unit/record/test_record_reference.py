"""The record reference generator (dpstudy.record.reference) on a small schema of its own: parts depth
first with their anchors, types, required fields and descriptions as table cells; and the record
schema itself: every field a record of the current code writes is declared there with a meaning."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from helpers.records import make_record, make_spec, make_util

from dpstudy.record import envinfo, reference
from dpstudy.record import fields as record

SCHEMA = {
    "title": "toy.json",
    "description": "A toy  record,\n written | whole.",
    "type": "object",
    "required": ["id", "host"],
    "properties": {
        "id": {"const": "toy/1", "description": "Its id."},
        "state": {"enum": ["ok", "bad"], "description": "How it ended."},
        "host": {
            "type": "object",
            "description": "Where it ran.",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "description": "The <host> name, `<as given>`."},
                "disks": {
                    "type": "array",
                    "description": "Its disks.",
                    "items": {"type": "object", "properties": {"gb": {"type": "integer", "minimum": 0}}},
                },
            },
        },
        "steps": {
            "type": "array",
            "description": "Each step.",
            "items": {"type": "object", "properties": {"s": {"type": "number", "description": "Seconds."}}},
        },
        "samples": {
            "type": ["object", "null"],
            "description": "By device.",
            "additionalProperties": {"type": "array", "items": {"type": "object", "properties": {"t": {}}}},
        },
        "probe": {
            "type": ["object", "null"],
            "description": "Timed parts.",
            "additionalProperties": False,
            "properties": {"x_s": {"type": "number", "description": "X."}},
        },
        "mem": {"type": "array", "items": {"type": ["number", "null"]}, "description": "MB | GB."},
    },
}


def section(text: str, heading: str) -> list[str]:
    lines = text.split("\n")
    start = lines.index(heading)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start:end]


def test_parts_come_depth_first_with_their_anchors():
    text = reference.render(SCHEMA)
    assert text.startswith("# toy.json reference\n\nGenerated from `RECORD_SCHEMA` (`dpstudy/record/fields.py`")
    assert "\n\nA toy record, written \\| whole.\n\n" in text
    headings = [line for line in text.split("\n") if line.startswith("## ")]
    # an object's own objects follow it, before the next top-level field's
    assert headings == [
        "## Top level",
        "## `host`",
        "## `host.disks[]`",
        "## `steps[]`",
        "## `samples.<name>[]`",
        "## `probe`",
    ]
    # GitHub's own anchor where the heading gives it, an explicit one where it does not
    for anchor in ["host-disks", "samples"]:
        assert f'<a id="{anchor}"></a>' in text and f"](#{anchor})" in text
    for anchor in ["top-level", "host", "steps", "probe"]:
        assert f'<a id="{anchor}">' not in text and f"](#{anchor})" in text


def test_rows_show_type_required_and_meaning():
    text = reference.render(SCHEMA)
    top = section(text, "## Top level")
    assert top[2:4] == ["| field | type | required | meaning |", "|---|---|---|---|"]
    assert "| `id` | `toy/1` | yes | Its id. |" in top
    assert "| `state` | `ok` \\| `bad` | no | How it ended. |" in top
    assert "| `host` | [mapping](#host) | yes | Where it ran. |" in top
    assert "| `steps` | list of [mapping](#steps) | no | Each step. |" in top
    assert "| `samples` | mapping of name to list of [mapping](#samples) or null | no | By device. |" in top
    assert "| `probe` | [mapping](#probe) or null | no | Timed parts. |" in top
    assert "| `mem` | list of (number or null) | no | MB \\| GB. |" in top
    host = section(text, "## `host`")
    assert "Where it ran." in host and "| `name` | string | yes | The &lt;host> name, `<as given>`. |" in host
    # no field of it required: no required column
    disks = section(text, "## `host.disks[]`")
    assert "| field | type | meaning |" in disks and "| `gb` | integer (>= 0) | |" in disks
    assert "| `t` | any | |" in section(text, "## `samples.<name>[]`")
    probe = section(text, "## `probe`")
    assert "Any other field is an error." in probe and "| `x_s` | number | X. |" in probe
    assert "Any other field is an error." not in host


def test_check_says_whether_the_page_is_current(tmp_path, capsys):
    page = tmp_path / "record.md"
    assert reference.main(["--check", "--out", str(page)]) == 1
    assert reference.main(["--out", str(page)]) == 0
    assert page.read_text() == reference.render()
    assert reference.main(["--check", "--out", str(page)]) == 0
    page.write_text(page.read_text().replace("Percent", "Per cent"))
    assert reference.main(["--check", "--out", str(page)]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"{page} is not current with dpstudy/record/fields.py: run `make docs`"
    )


# The record schema itself.


def undescribed(value: Any, node: dict, path: str = "") -> Iterator[str]:
    """The paths in `value` whose field the schema does not declare with a description. A mapping's
    keyed values (util's devices, an allocator's variables) are explained by the mapping's own."""
    if isinstance(value, dict):
        for key, item in value.items():
            child = node.get("properties", {}).get(key)
            if child is None and isinstance(node.get("additionalProperties"), dict):
                yield from undescribed(item, node["additionalProperties"], f"{path}.<{key}>")
            elif child is None or not child.get("description"):
                yield f"{path}.{key}"
            elif key != "spec" or path:  # the spec's keys are the study config's (docs/config.md)
                yield from undescribed(item, child, f"{path}.{key}")
    elif isinstance(value, list) and isinstance(node.get("items"), dict):
        for item in value:
            yield from undescribed(item, node["items"], path + "[]")


def current_record(tmp_path, monkeypatch) -> dict:
    """A record as the engine writes it: the env envinfo measures in this process, with the ranks
    and the factory hash dpstudy.engine.cell adds, and the summary dpstudy.engine.outcome makes;
    the epochs, utilisation, probe and memory as the test helpers make them."""
    from dpstudy.engine import cell
    from dpstudy.engine.outcome import Outcome

    spec = make_spec(mode="ddp", gpus=2, backend="gloo", compile=True)
    monkeypatch.setattr(cell.models, "factory_hash", lambda model, code_path=None: "0123456789ab")
    env = cell.with_user_code(envinfo.environment(2, "cpu", 1), spec)
    env["ranks"] = [{**envinfo.rank_host(rank, rank), "cores": [rank]} for rank in range(2)]
    base = make_record(mode="ddp", gpus=2, backend="gloo", util=make_util(2, [60.0, 58.0]), memory=[(1.0,) * 4] * 2)
    outcome = Outcome(tmp_path, base["cell"], spec, time.time())
    outcome.env, outcome.epochs, outcome.util = env, base["epochs"], base["util"]
    outcome.probe = {"steps": 8, "sync_step_s": 0.04, "nosync_step_s": 0.03, "allreduce_s": 0.02, "buckets": 1}
    outcome.memory = {**base["memory"], "rss_growth_mb": [2.0, None]}
    outcome.classes, outcome.test_samples, outcome.startup_s = 10, 1000, 1.5
    outcome.stopped_early = "training loss became nan in epoch 2"
    return outcome.as_record("ok", None)


def test_every_field_a_record_of_the_current_code_writes_has_a_meaning(tmp_path, monkeypatch):
    rec = current_record(tmp_path, monkeypatch)
    record.validate(rec)
    # the walk reaches what envinfo measures, the ranks, the optional summary fields and the samples
    assert {"cuda", "cudnn", "cpu_count", "gpus", "threads_per_process", "torch_provider"} <= rec["env"].keys()
    assert rec["env"]["code_version"]["user_hash"] == "0123456789ab" and "allocator" in rec["env"]["ranks"][0]
    assert {"compile_s", "learned", "learned_reason", "stopped_early"} <= rec["summary"].keys()
    assert list(undescribed(rec, record.RECORD_SCHEMA)) == []
    # what the launcher writes for a cell no rank measured
    launcher = record.make(rec["cell"], "failed", "rank 1 exited", rec["spec"], envinfo.fallback_environment(2, 1))
    record.validate(launcher)
    assert list(undescribed(launcher, record.RECORD_SCHEMA)) == []
    # and a field the schema does not declare is found, at any depth
    rec["env"]["ranks"][1]["numa"] = 0
    rec["summary"]["energy_j"] = 1.0
    assert list(undescribed(rec, record.RECORD_SCHEMA)) == [".env.ranks[].numa", ".summary.energy_j"]


def test_every_field_the_schema_declares_has_a_meaning():
    def nodes(node: dict, path: str) -> Iterator[tuple[str, dict]]:
        for name, child in node.get("properties", {}).items():
            yield f"{path}.{name}", child
            yield from nodes(child, f"{path}.{name}")
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                yield from nodes(node[key], f"{path}[]")

    declared = dict(nodes(record.RECORD_SCHEMA, ""))
    assert len(declared) > 100 and ".env.ranks[].allocator.variables" in declared
    assert [path for path, node in declared.items() if not node.get("description")] == []
