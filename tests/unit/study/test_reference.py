"""The config reference generator (dpstudy.study.reference) on a small schema of its own: sections in
schema order with their anchors, $refs resolved, types, defaults and descriptions as table cells."""

from __future__ import annotations

from dpstudy.study import reference

SCHEMA = {
    "title": "toy",
    "description": "A toy study.",
    "type": "object",
    "additionalProperties": False,
    "required": ["runs"],
    "properties": {
        "name": {"$ref": "#/$defs/name", "default": "toy", "description": "Shown  in\n the report."},
        "runs": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/run"}},
        "knobs": {"$ref": "#/$defs/knobs", "default": {}, "description": "Every run's knobs."},
        "extra": {
            "type": "object",
            "default": {},
            "properties": {"level": {"type": "number", "exclusiveMinimum": 0, "maximum": 9, "default": 1.5}},
        },
        "budget": {"type": ["number", "null"], "default": None, "description": "GiB | none."},
    },
    "$defs": {
        "name": {"type": "string", "pattern": "^[a-z]+$(?!\\n)", "description": "A name."},
        "knobs": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "mode": {"enum": ["fast", "slow"], "default": "fast", "description": "How, <module>:`<fn>`."},
                "on": {"type": "boolean", "default": True},
                "tags": {"type": "array", "items": {"type": "string"}, "default": ["a", "b"]},
            },
        },
        "run": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"$ref": "#/$defs/name"},
                "knobs": {"$ref": "#/$defs/knobs", "description": "This run's knobs."},
                "where": {"type": "object", "additionalProperties": {"$ref": "#/$defs/knobs"}},
            },
        },
        "cell": {"type": "object", "properties": {"mode": {"$ref": "#/$defs/knobs/properties/mode"}}},
    },
}


def section(text: str, heading: str) -> list[str]:
    lines = text.split("\n")
    start = lines.index(heading)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start:end]


def test_sections_come_in_schema_order_with_their_anchors():
    text = reference.render(SCHEMA)
    assert text.startswith("# toy config reference\n\nGenerated from `dpstudy/study/schema.yaml` by `make docs`")
    headings = [line for line in text.split("\n") if line.startswith("## ")]
    # breadth first: the top-level keys' sections in key order, then what they hold, then the
    # definitions no key reaches
    assert headings == [
        "## Top-level keys",
        "## `runs[]`",
        "## `knobs`",
        "## `extra`",
        "## `cell` (not a key of a study)",
    ]
    for anchor in ["run", "cell"]:
        assert f'<a id="{anchor}"></a>' in text and f"](#{anchor})" in text
    assert '<a id="knobs">' not in text and "- [`knobs`](#knobs)" in text  # GitHub's own anchor


def test_rows_show_type_default_and_meaning():
    top = section(reference.render(SCHEMA), "## Top-level keys")
    assert "Any other key is an error." in top
    assert "| `name` | string matching `^[a-z]+$` | `toy` | Shown in the report. |" in top
    assert "| `runs` | non-empty list of [mapping](#run) | *required* | |" in top
    assert "| `knobs` | [mapping](#knobs) | `{}` | Every run's knobs. |" in top
    assert "| `extra` | [mapping](#extra) | `{}` | |" in top
    assert "| `budget` | number or null | `null` | GiB \\| none. |" in top


def test_a_shared_definition_is_one_section_naming_every_use():
    text = reference.render(SCHEMA)
    knobs = section(text, "## `knobs`")
    assert "- `knobs`: Every run's knobs." in knobs and "- `runs[].knobs`: This run's knobs." in knobs
    assert "| `mode` | `fast` \\| `slow` | `fast` | How, &lt;module>:`<fn>`. |" in knobs
    assert "| `on` | boolean | `true` | |" in knobs and "| `tags` | list of string | `[a, b]` | |" in knobs
    assert text.count("## `knobs`") == 1
    run = section(text, "## `runs[]`")
    assert "| `name` | string matching `^[a-z]+$` | *required* | A name. |" in run
    assert "| `where` | mapping of name to [mapping](#knobs) | – | |" in run
    assert "| `level` | number (> 0, <= 9) | `1.5` | |" in section(text, "## `extra`")
    cell = section(text, "## `cell` (not a key of a study)")
    assert "| `mode` | `fast` \\| `slow` | `fast` | As `mode` of [`knobs`](#knobs). |" in cell


def test_check_says_whether_the_page_is_current(tmp_path, capsys):
    page = tmp_path / "config.md"
    assert reference.main(["--check", "--out", str(page)]) == 1
    assert reference.main(["--out", str(page)]) == 0
    assert page.read_text() == reference.render()
    assert reference.main(["--check", "--out", str(page)]) == 0
    page.write_text(page.read_text() + "edited by hand\n")
    assert reference.main(["--check", "--out", str(page)]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"{page} is not current with dpstudy/study/schema.yaml: run `make docs`"
    )
