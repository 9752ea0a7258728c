"""docs/glossary.md against a report: every column header the report shows must be a term the
glossary defines (a heading of its concepts, or a row of its table of the report's columns)."""

from __future__ import annotations

import html
import re
from pathlib import Path

from helpers import REPO

GLOSSARY = REPO / "docs/glossary.md"


def glossary_terms(text: str) -> set[str]:
    """The terms a glossary page defines: its level-3 headings ("### cell"; "### a, b" defines
    both) and the first cell of each table row, each backticked name in it a term."""
    terms: set[str] = set()
    for heading in re.findall(r"^### (.+)$", text, re.M):
        terms |= {part.strip() for part in heading.split(",")}
    for first in re.findall(r"^\| (.+?) \|", text, re.M):
        terms |= set(re.findall(r"`([^`]+)`", first))
    return terms


def report_columns(page: str) -> set[str]:
    """The column headers of an HTML report's tables, as they read."""
    cells = re.findall(r"<th[^>]*>(.*?)</th>", page, re.S)
    return {html.unescape(re.sub(r"<[^>]+>", "", cell)).strip() for cell in cells} - {""}


def undefined_columns(page: str, terms: set[str]) -> list[str]:
    """The report's headers no term defines. A header "<what>: <column>" (the collectives' table:
    "gloo on cpu, 2 ranks: bus GB/s") is defined by its column."""
    return sorted(c for c in report_columns(page) if c not in terms and c.rsplit(": ", 1)[-1] not in terms)


def undefined_in_glossary(page: str, glossary: Path = GLOSSARY) -> list[str]:
    return undefined_columns(page, glossary_terms(glossary.read_text()))
