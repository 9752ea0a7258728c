"""docs/glossary.md defines the concepts the code and the report name (issue 49's list), and the
checker that holds a report's column headers to it finds a header it does not define."""

from __future__ import annotations

from helpers.glossary import GLOSSARY, glossary_terms, report_columns, undefined_columns

CONCEPTS = {
    "cell", "setting", "workload", "strategy", "mode", "sweep", "study", "repeat", "plan", "forecast", "floor",
}  # fmt: skip


def test_the_glossary_defines_every_concept_the_code_names():
    terms = glossary_terms(GLOSSARY.read_text())
    assert CONCEPTS <= terms, sorted(CONCEPTS - terms)
    # the report's columns are defined too, e.g. the why-not-n table's and the cell listing's
    assert {"samples/s [95 %]", "step model", "noise ms", "stale", "bus GB/s"} <= terms


def test_the_checker_finds_a_column_the_glossary_does_not_define():
    glossary = "### cell\n### devices, rank\n\n| column | meaning |\n|---|---|\n| `speedup`, `time` | x |\n"
    terms = glossary_terms(glossary)
    assert terms == {"cell", "devices", "rank", "speedup", "time"}
    page = (
        "<table><tr><th>cell</th><th>speedup</th><th>gloo on cpu, 2 ranks: time</th>"
        "<th style='x'>noise <em>s</em></th><th></th></tr></table>"
    )
    assert report_columns(page) == {"cell", "speedup", "gloo on cpu, 2 ranks: time", "noise s"}
    assert undefined_columns(page, terms) == ["noise s"]
