"""Markdown reference pages made from a JSON Schema's own words: the pieces the study config
reference (dpstudy.study.reference, docs/config.md) and the record reference
(dpstudy.record.reference, docs/record.md) share. Types as a reader writes them, descriptions as
table cells, headings with stable anchors, and the `--check`/`--out` command that writes a page
or says whether it is current.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dpstudy.util import atomic

# Python's $ (jsonschema's) also matches before a final newline; the schema guards against it,
# and a reader of the reference needs the pattern without the guard.
NEWLINE_GUARD = "(?!\\n)"
LONGEST_PATTERN = 20  # longer patterns (<module>:<callable>) are explained by the description
BOUNDS = [("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<")]


def resolve(root: dict, node: Any) -> Any:
    """`node` with its local $refs followed; the referring node's own keys win (as in schema.py)."""
    while isinstance(node, dict) and "$ref" in node:
        target: Any = root
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def literal(value: Any) -> str:
    """A default or enum value as it would be written in YAML."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str):
        return value or '""'
    return str(value)


def code(text: str) -> str:
    return "`" + text.replace("|", "\\|") + "`"  # a table cell ends at any unescaped |


def one_line(text: str) -> str:
    """A description as one table cell: whitespace collapsed, | escaped, and < outside code
    escaped, so that <module> shows instead of being taken for an HTML tag."""
    parts = " ".join(text.split()).replace("|", "\\|").split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;") for i, p in enumerate(parts))


def object_of(root: dict, raw: Any, path: str) -> tuple[str, dict, str] | None:
    """(anchor, object node, key path) when `raw`, its items or its values are an object with
    properties of its own: a $defs target is anchored by its name, an inline one by its path."""
    node = resolve(root, raw)
    if not isinstance(node, dict):
        return None
    if node.get("properties"):
        ref = raw.get("$ref", "") if isinstance(raw, dict) else ""
        if ref.startswith("#/$defs/") and ref.count("/") == 2:
            name = ref.rsplit("/", 1)[-1]  # the definition alone: the referring key's own words go with it
            return name, root["$defs"][name], path
        return re.sub(r"\[\]|\.<name>", "", path).replace(".", "-"), node, path
    if isinstance(node.get("items"), dict):
        return object_of(root, node["items"], path + "[]")
    if isinstance(node.get("additionalProperties"), dict):
        return object_of(root, node["additionalProperties"], path + ".<name>")
    return None


def type_of(root: dict, raw: Any, path: str) -> str:
    """What the key at `path` takes: enums and constants as `a` \\| `b`, bounds and short patterns
    inline, and an object with properties of its own as a link to its section."""
    node = resolve(root, raw)
    types = node.get("type", [])
    types = types if isinstance(types, list) else [types]
    if node.get("properties"):
        link = f"[mapping](#{object_of(root, raw, path)[0]})"
        return link + " or null" if "null" in types else link
    if "enum" in node or "const" in node:
        return " \\| ".join(code(literal(v)) for v in node.get("enum", [node.get("const")]))
    if "anyOf" in node or "oneOf" in node:
        alternatives = [type_of(root, a, path) for a in node.get("anyOf", node.get("oneOf"))]
        # Alternatives that differ in their pattern alone read as one: the description tells them apart.
        return " or ".join(dict.fromkeys(re.sub(r" matching `.*`$", "", a) for a in alternatives))
    return " or ".join(one_type(root, node, t, path) for t in types) or "any"


def one_type(root: dict, node: dict, kind: str, path: str) -> str:
    if kind == "array":
        items = node.get("items")
        inner = type_of(root, items, path + "[]") if items else ""
        # alternatives of the items in parentheses: `list of (number or null)`, not a list or null
        word = f"list of ({inner})" if " or " in inner else f"list of {inner}" if inner else "list"
        return "non-empty " + word if node.get("minItems", 0) >= 1 else word
    if kind == "object":
        values = node.get("additionalProperties")
        return (
            "mapping of name to " + type_of(root, values, path + ".<name>") if isinstance(values, dict) else "mapping"
        )
    if kind in ("integer", "number"):
        bounds = [f"{sign} {literal(node[key])}" for key, sign in BOUNDS if key in node]
        return f"{kind} ({', '.join(bounds)})" if bounds else kind
    if kind == "string":
        pattern = node.get("pattern", "").replace(NEWLINE_GUARD, "")
        word = "non-empty string" if node.get("minLength", 0) >= 1 else "string"
        return f"{word} matching {code(pattern)}" if pattern and len(pattern) <= LONGEST_PATTERN else word
    return kind


def heading(title: str, anchor: str) -> list[str]:
    """A section's heading. GitHub anchors a heading by its text; where that differs from `anchor`,
    an explicit anchor is the stable one."""
    slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
    return ([f'<a id="{anchor}"></a>', ""] if slug != anchor else []) + [f"## {title}", ""]


def row(cells: list[str]) -> str:
    """One table row; an empty cell stays one space wide."""
    return "|" + "|".join(f" {cell} " if cell else " " for cell in cells) + "|"


def main(argv: list[str] | None, *, prog: str, doc: str, out: str, source: str, render: Callable[[], str]) -> int:
    """Write the page `render` makes to --out (default `out`), or with --check write nothing and
    exit 1 when the page there is not that text. `source` names what the page is made from."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    parser.add_argument("--out", default=out, help=f"the page to write or check (default {out})")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when the page is not current")
    args = parser.parse_args(argv)
    text, page = render(), Path(args.out)
    if args.check:
        if not page.is_file() or page.read_text() != text:
            print(f"{page} is not current with {source}: run `make docs`", file=sys.stderr)
            return 1
        return 0
    atomic.write_text(page, text)
    return 0
