"""The floor runs as a table and the summary's floor columns (dpstudy.analysis.floor)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pandas as pd
import pytest
from helpers import REPO
from helpers.records import make_record, write_records

from dpstudy.analysis import floor
from dpstudy.analysis.records import RecordError


def write_runs(folder, compute, memory, dispatch=None):
    paths = []
    for repeat, (c, m) in enumerate(zip(compute, memory, strict=True)):
        path = folder / f"r{repeat}.json"
        run = {"repeat": repeat, "device": "cpu", "threads": 2, "seconds": 3.0, "compute_gflops": c}
        if dispatch is not None:  # runs made before the dispatch part have none
            run["dispatch_mops"] = dispatch[repeat]
        path.write_text(json.dumps({**run, "memory_gbps": m, "other_load": 0.1, "host": "vm"}))
        paths.append(path)
    return paths[::-1]  # any order: the table is by repeat


def test_the_floor_cv_is_the_largest_of_the_three_rates_cvs(tmp_path):
    runs = write_runs(tmp_path, [100.0, 102.0, 98.0], [10.0, 10.0, 10.4], dispatch=[1.0, 1.01, 0.99])
    table = floor.floor_table(runs)
    assert list(table["repeat"]) == [0, 1, 2] and list(table["compute_gflops"]) == [100.0, 102.0, 98.0]
    assert list(table["dispatch_mops"]) == [1.0, 1.01, 0.99]
    summary = floor.floor_summary(table, noise_cv=0.08)
    assert summary["floor_runs"] == 3
    assert summary["floor_compute_cv"] == pytest.approx(0.02)  # sd 2 over mean 100
    assert summary["floor_memory_cv"] == pytest.approx(pd.Series([10, 10, 10.4]).std() / (30.4 / 3))  # 2.3 %
    assert summary["floor_dispatch_cv"] == pytest.approx(0.01)
    assert summary["floor_cv"] == summary["floor_memory_cv"] > summary["floor_compute_cv"]
    assert summary["floor_verdict"] == "above the floor"  # 8 % > 2 x 2.3 %


def test_a_host_bound_floor_is_the_dispatch_part_s(tmp_path):
    # As on the H200: the GPU's matmuls and copies steady, the host's operator launches not.
    runs = write_runs(tmp_path, [5e4, 5.01e4, 4.99e4], [4190.0, 4200.0, 4195.0], dispatch=[0.2, 0.22, 0.18])
    summary = floor.floor_summary(floor.floor_table(runs), noise_cv=0.12)
    assert summary["floor_cv"] == summary["floor_dispatch_cv"] == pytest.approx(0.1)
    assert summary["floor_verdict"] == "high floor"


def test_runs_without_a_dispatch_rate_keep_the_other_two(tmp_path):
    table = floor.floor_table(write_runs(tmp_path, [100.0, 102.0, 98.0], [10.0, 10.0, 10.0]))
    summary = floor.floor_summary(table, noise_cv=0.01)
    assert math.isnan(summary["floor_dispatch_cv"]) and summary["floor_cv"] == pytest.approx(0.02)


@pytest.mark.parametrize(
    "noise, floor_cv, verdict",
    [
        (0.02, 0.015, "at the floor"),
        (0.03, 0.015, "at the floor"),  # exactly 2x
        (0.031, 0.015, "above the floor"),
        (0.035, 0.03, "high floor"),
        (0.02, 0.03, "below the floor"),  # the cells steadier than the reference: no bound
        (0.01, 0.015, "below the floor"),
        (math.nan, 0.01, None),
        (0.02, math.nan, None),
    ],
)
def test_the_verdict_sets_the_noise_against_the_floor(noise, floor_cv, verdict):
    assert floor.noise_verdict(noise, floor_cv) == verdict


def test_fewer_than_two_runs_give_no_cv(tmp_path):
    one = floor.floor_summary(floor.floor_table(write_runs(tmp_path, [100.0], [10.0])), noise_cv=0.02)
    assert one["floor_runs"] == 1 and math.isnan(one["floor_cv"]) and one["floor_verdict"] is None
    none = floor.floor_summary(floor.floor_table([]), noise_cv=0.02)
    assert none["floor_runs"] == 0 and math.isnan(none["floor_cv"])


@pytest.mark.parametrize(
    "content, message",
    [
        ("{", "not a floor run"),
        ("[1]", "not a floor run (a JSON object is expected)"),
        ('{"repeat": 0, "device": "cpu", "compute_gflops": 1.0}', "floor run without 'memory_gbps'"),
        ('{"repeat": 0, "device": "cpu", "compute_gflops": 0, "memory_gbps": 1}', "compute_gflops is 0, not a"),
        ('{"repeat": 0, "device": "cpu", "compute_gflops": 1, "memory_gbps": true}', "memory_gbps is True, not a"),
        (
            '{"repeat": 0, "device": "cpu", "compute_gflops": 1, "memory_gbps": 1, "dispatch_mops": -1}',
            "dispatch_mops is -1, not a",
        ),
    ],
)
def test_a_bad_run_file_is_an_error_naming_it(tmp_path, content, message):
    path = tmp_path / "r0.json"
    path.write_text(content)
    with pytest.raises(RecordError, match=rf"{path}: .*{message.replace('(', '.').replace(')', '.')}"):
        floor.floor_table([path])


def test_collect_writes_the_floor_table_and_its_summary(tmp_path):
    records = write_records(
        tmp_path / "cells", [make_record(repeat=r, suffix=f"-r{r}", samples_per_s=1000.0 + 30 * r) for r in range(3)]
    )
    runs = write_runs(tmp_path, [100.0, 102.0, 98.0], [10.0, 10.1, 9.9])
    out = tmp_path / "tables"
    cmd = [sys.executable, str(REPO / "scripts/collect.py"), "--records", *map(str, records), "--out-dir", str(out)]
    proc = subprocess.run([*cmd, "--floor", *map(str, runs)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert len(pd.read_csv(out / "floor.csv")) == 3
    summary = pd.read_csv(out / "summary.csv").iloc[0]
    assert summary["floor_runs"] == 3 and summary["floor_cv"] == pytest.approx(0.02)
    assert summary["floor_verdict"] == "at the floor"  # CV 3 % of the 3 repeats against 2 %
    bad = runs[0]
    bad.write_text("{}")
    proc = subprocess.run([*cmd, "--floor", *map(str, runs)], capture_output=True, text=True)
    assert proc.returncode == 1 and f"error: {bad}: floor run without 'repeat'" in proc.stderr


def gauged(rates: list[tuple[float, float]], gflops: list[float], **keys) -> list[dict]:
    """Repeats of one setting: (throughput, and the gauge's GFLOP/s in every epoch) each."""
    out = []
    for r, (rate, machine) in enumerate(zip(rates, gflops, strict=True)):
        rec = make_record(repeat=r, suffix=f"-r{r}", samples_per_s=rate, **keys)
        for epoch in rec["epochs"]:
            epoch.update(machine_gflops=machine, machine_mops=0.4)  # dispatch steady: GFLOP/s moves
        out.append(rec)
    return out


def test_each_setting_sets_its_noise_against_the_machine_at_its_own_moments(tmp_path):
    from helpers.plots import tables_of

    from dpstudy.report.findings.noise import noise

    records = [
        # the machine moved 10 % between the repeats and the throughput with it: steady for this machine
        *gauged([1000.0, 1100.0, 900.0], [100.0, 110.0, 90.0], batch=64),
        # the machine still, the throughput not: noise of the cell's own
        *gauged([1000.0, 1100.0, 900.0], [100.0, 100.0, 100.0], batch=256),
    ]
    tables = tables_of(tmp_path, records)
    settings = tables["settings"].set_index("batch")
    assert settings.loc[64, "machine_cv"] == pytest.approx(0.1) and settings.loc[256, "machine_cv"] == pytest.approx(0)
    assert settings.loc[64, "noise_cv"] == pytest.approx(0.1)
    summary = tables["summary"].iloc[0]
    assert summary["machine_settings"] == 2 and summary["near_machine"] == 1  # 10 % <= 2 x 10 %; not <= 3 %
    assert summary["machine_max_cv"] == pytest.approx(0.1)
    text = noise(tables)
    assert "Inside the cells, the same reference workload timed after every epoch moved by a median CV of 5.0 %" in text
    assert "1 of 2 settings (every mode) vary by at most 3 % or 2x the machine's own CV" in text
    assert "CV 10.0 % over 3 runs, the machine 10.0 %" in text
