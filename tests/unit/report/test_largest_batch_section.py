"""The "Which strategy?" section's comparison at each strategy's largest batch that fits
(dpstudy.report.findings.largest_batch), phrased from the largest_batch table read back from CSV."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
from helpers.glossary import GLOSSARY, glossary_terms
from helpers.records import CURRENT, make_record, write_records

from dpstudy.analysis import collect, tablefiles
from dpstudy.report import findings
from dpstudy.study.budget import GIB


def t1(b: float) -> float:
    return 2e-3 + 5e-5 * b


def records() -> list[dict]:
    """One device at 64 and 128 (40 MB of state, 0.5 MB per sample), DDP over 2 at 128 and 256 (50 MB
    per device: a gradient more), three repeats each."""
    out = []
    for k, wobble in enumerate((0.99, 1.0, 1.01)):
        for b in (64, 128):
            memory = [(10.0, 10.0, 20.0, 0.5 * b)]
            out.append(make_record(samples_per_s=b / t1(b) * wobble, batch=b, repeat=k, suffix=f"-r{k}", memory=memory))
        for b in (128, 256):
            out.append(
                make_record(
                    samples_per_s=30_000.0 * wobble,
                    mode="ddp",
                    gpus=2,
                    backend="gloo",
                    batch=b,
                    memory=[(10.0, 20.0, 20.0, 0.25 * b)] * 2,
                    repeat=k,
                    suffix=f"-r{k}",
                )
            )
    return out


def tables_at(root: Path, budget_gib: float | None) -> dict[str, pd.DataFrame]:
    tables = collect.summarise(collect.collect(write_records(root, records()), CURRENT), budget_gib=budget_gib)
    tablefiles.write_tables(tables, root / "tables")  # the report reads them back from CSV
    return tablefiles.read_tables(root / "tables")


def test_each_strategy_at_its_largest_batch_is_measured_or_forecast_and_the_fastest_named(tmp_path):
    # 125.6 MB: DDP's 50 + 0.5 b fits up to 128 per device, where it ran; one device's 40 + 0.5 b
    # up to 148, where it did not
    text = findings.strategies(tables_at(tmp_path, 125.6 / GIB))
    assert "**At the largest batch that fits.**" in text
    assert (
        "**synthetic/lenet** at the largest batch that fits, within 0.123 GiB per device "
        "(the study's memory_budget_gib):" in text
    )
    header = "| strategy | largest per-device batch | samples/s [95 %] | measured or forecast |"
    assert header in text
    interval = r"\[[0-9,]+-[0-9,]+\]"
    assert re.search(rf"\| DDP \(gloo\) on 2 devices \| 128 \(interpolated\) \| 30,000 {interval} \| measured \|", text)
    assert re.search(rf"\| one device \| 148 \(extrapolated\) \| 15,700 {interval} \| forecast \|", text)
    assert re.search(
        r"Fastest there: \*\*DDP \(gloo\) on 2 devices\*\* at per-device batch 128, 30,000 samples/s \[[0-9,-]+\] "
        r"\(measured\); its interval clears that of the next, one device\.",
        text,
    )
    # every header it shows is defined in the glossary
    terms = glossary_terms(GLOSSARY.read_text())
    assert {c.strip() for c in header.strip("|").split("|")} <= terms


def test_without_a_capacity_the_section_says_why_there_is_no_largest_batch(tmp_path):
    text = findings.strategies(tables_at(tmp_path, None))
    assert (
        "*At the largest batch that fits:* no strategy has one here (no capacity: a CPU study without "
        "memory_budget_gib, so nothing bounds the batch)." in text
    )


@pytest.mark.parametrize("absent", [True, False])
def test_tables_without_the_largest_batch_table_leave_the_section_as_it_was(tmp_path, absent):
    tables = tables_at(tmp_path, None)
    if absent:
        del tables["largest_batch"]
    else:
        tables["largest_batch"] = tables["largest_batch"].iloc[0:0]
    assert "largest batch that fits" not in findings.strategies(tables)
