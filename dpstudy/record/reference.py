"""The record reference, docs/record.md, generated from RECORD_SCHEMA (dpstudy/record/fields.py,
its fields in dpstudy/record/schema.py): every field of record.json with its type, whether a
record must have it, and its meaning, so that no page written by hand can drift from the schema.

  python -m dpstudy.record.reference [--out docs/record.md]   write it (what `make docs` runs)
  python -m dpstudy.record.reference --check                  exit 1 when it is not current
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from dpstudy.record.fields import RECORD_SCHEMA
from dpstudy.util import schemadoc
from dpstudy.util.schemadoc import code, object_of, one_line, row, type_of

OUT = "docs/record.md"
SOURCE, PARTS = "dpstudy/record/fields.py", "dpstudy/record/schema.py"
TOP = "top-level"  # the anchor of the top-level table, GitHub's for its heading


@dataclass
class Part:
    """An object with fields of its own: its anchor, schema node, path in a record and meaning."""

    anchor: str
    node: dict
    path: str
    description: str = ""

    @property
    def title(self) -> str:
        return "Top level" if self.anchor == TOP else code(self.path)


def parts_of(root: dict, node: dict | None = None, path: str = "") -> list[Part]:
    """Every object with fields of its own, depth first in schema order: a part, then the objects
    inside it (env, then env.code_version, env.ranks[], ...), so that each follows its parent."""
    found = [Part(TOP, root, "")] if node is None else []
    for name, raw in (root if node is None else node).get("properties", {}).items():
        inner = object_of(root, raw, path + name)
        if inner:
            anchor, child, where = inner
            found += [Part(anchor, child, where, raw.get("description", "")), *parts_of(root, child, where + ".")]
    return found


def rows_of(root: dict, part: Part) -> list[str]:
    """The part's table; a required column only where the part requires some of its fields."""
    required = part.node.get("required", [])
    header = ["field", "type", *(["required"] if required else []), "meaning"]
    rows = [row(header), "|" + "---|" * len(header)]
    for name, raw in part.node.get("properties", {}).items():
        needed = ["yes" if name in required else "no"] if required else []
        prefix = part.path + "." if part.path else ""
        rows.append(row([code(name), type_of(root, raw, prefix + name), *needed, one_line(raw.get("description", ""))]))
    return rows


def section_lines(root: dict, part: Part) -> list[str]:
    lines = schemadoc.heading(part.title, part.anchor)
    lines += [one_line(part.description), ""] if part.description else []
    if part.node.get("additionalProperties") is False:
        lines += ["Any other field is an error.", ""]
    return lines + rows_of(root, part)


def render(root: dict | None = None) -> str:
    """docs/record.md's text for the schema `root` (default: RECORD_SCHEMA)."""
    root = RECORD_SCHEMA if root is None else root
    parts = parts_of(root)
    lines = [
        f"# {root.get('title', 'Record')} reference",
        "",
        f"Generated from `RECORD_SCHEMA` (`{SOURCE}`, its parts' fields in `{PARTS}`) by `make docs`: do not edit"
        " it by hand; change the schema's `description`s and run `make docs`.",
        "",
        one_line(root.get("description", "")),
        "",
        *[f"- [{part.title}](#{part.anchor})" for part in parts],
    ]
    for part in parts:
        lines += ["", *section_lines(root, part)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write docs/record.md, or with --check say whether it is current (exit 1 when not)."""
    prog = "python -m dpstudy.record.reference"
    return schemadoc.main(argv, prog=prog, doc=__doc__, out=OUT, source=SOURCE, render=render)


if __name__ == "__main__":
    sys.exit(main())
