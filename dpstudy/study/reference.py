"""The study config reference, docs/config.md, generated from dpstudy/study/schema.yaml: every key
with its type, default and meaning, so that no page written by hand beside the schema can drift
from it.

  python -m dpstudy.study.reference [--out docs/config.md]   write it (what `make docs` runs)
  python -m dpstudy.study.reference --check                  exit 1 when it is not current
"""

from __future__ import annotations

import re
import sys
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from dpstudy.study import schema
from dpstudy.util import schemadoc
from dpstudy.util.schemadoc import code, literal, object_of, one_line, resolve, row, type_of

OUT = "docs/config.md"
TOP = "top-level-keys"  # the anchor of the top-level table, GitHub's for its heading
PROPERTY_REF = re.compile(r"^#/\$defs/(\w+)/properties/(\w+)$")


@dataclass
class Section:
    """One object with properties of its own: its anchor, schema node and where a study uses it."""

    anchor: str
    node: dict
    uses: list[tuple[str, str]] = field(default_factory=list)  # (key path, its description)

    @property
    def prefix(self) -> str:
        """What the key path of each of its keys starts with: `sweeps[].` for `sweeps[].set`."""
        return self.uses[0][0] + "." if self.uses else ""


def default_of(node: dict, name: str, required: list[str]) -> str:
    if "default" in node:
        return code(literal(node["default"]))
    return "*required*" if name in required else "–"


def meaning_of(root: dict, raw: Any, node: dict, sections: dict[str, Section]) -> str:
    """The key's description; a key that reuses another section's key links to it instead."""
    ref = PROPERTY_REF.match(raw.get("$ref", "")) if isinstance(raw, dict) else None
    if ref and ref[1] in sections and "description" not in raw:
        where = sections[ref[1]].uses[0][0] if sections[ref[1]].uses else ref[1]
        return f"As `{ref[2]}` of [`{where}`](#{ref[1]})."
    items = resolve(root, node.get("items", {}))
    return one_line(node.get("description", items.get("description", "") if isinstance(items, dict) else ""))


def sections_of(root: dict) -> dict[str, Section]:
    """Every object with properties, breadth first in schema order (so the top-level keys' own
    sections come in the order of the keys), then the $defs no key of a study reaches."""
    sections = {TOP: Section(TOP, root)}
    queue = deque([TOP])
    unreached = [name for name, d in root.get("$defs", {}).items() if isinstance(d, dict) and d.get("properties")]
    while queue or unreached:
        if not queue:  # a definition only other tools take (the engine's single-cell spec)
            name = unreached.pop(0)
            if name not in sections:
                sections[name] = Section(name, root["$defs"][name])
                queue.append(name)
            continue
        section = sections[queue.popleft()]
        for name, raw in section.node.get("properties", {}).items():
            found = object_of(root, raw, section.prefix + name)
            if found:
                anchor, node, path = found
                if anchor not in sections:
                    sections[anchor] = Section(anchor, node)
                    queue.append(anchor)
                sections[anchor].uses.append((path, one_line(resolve(root, raw).get("description", ""))))
    return sections


def rows_of(root: dict, section: Section, sections: dict[str, Section]) -> list[str]:
    required = section.node.get("required", [])
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for name, raw in section.node.get("properties", {}).items():
        node = resolve(root, raw)
        cells = [code(name), type_of(root, raw, section.prefix + name), default_of(node, name, required)]
        cells.append(meaning_of(root, raw, node, sections))
        rows.append(row(cells))
    return rows


def heading(section: Section) -> str:
    if section.anchor == TOP:
        return "Top-level keys"
    return code(section.uses[0][0]) if section.uses else f"{code(section.anchor)} (not a key of a study)"


def section_lines(root: dict, section: Section, sections: dict[str, Section]) -> list[str]:
    lines = schemadoc.heading(heading(section), section.anchor)
    own = one_line(section.node.get("description", "")) if section.anchor != TOP else ""
    if not section.uses and section.anchor != TOP:
        own = f"`$defs/{section.anchor}` of the schema, which no key of a study refers to. {own}".strip()
    described = [f"- {code(path)}: {text}" for path, text in section.uses if text]
    lines += [own, ""] if own else []
    lines += [*described, ""] if described else []
    if section.node.get("additionalProperties") is False:
        lines += ["Any other key is an error.", ""]
    return lines + rows_of(root, section, sections)


def render(root: dict | None = None) -> str:
    """docs/config.md's text for the schema `root` (default: dpstudy/study/schema.yaml)."""
    root = schema.schema() if root is None else root
    sections = sections_of(root)
    lines = [
        f"# {root.get('title', 'Study')} config reference",
        "",
        "Generated from `dpstudy/study/schema.yaml` by `make docs`: do not edit it by hand; change the",
        "schema's `description`s and run `make docs`.",
        "",
        one_line(root.get("description", "")),
        "",
        *[f"- [{heading(s)}](#{s.anchor})" for s in sections.values()],
    ]
    for section in sections.values():
        lines += ["", *section_lines(root, section, sections)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write docs/config.md, or with --check say whether it is current (exit 1 when not)."""
    prog, source = "python -m dpstudy.study.reference", "dpstudy/study/schema.yaml"
    return schemadoc.main(argv, prog=prog, doc=__doc__, out=OUT, source=source, render=render)


if __name__ == "__main__":
    sys.exit(main())
