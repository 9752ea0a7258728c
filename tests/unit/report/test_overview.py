"""The overview of a study of many settings: varied keys, pivots of medians, extremes, the heat maps."""

from __future__ import annotations

import statistics

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from helpers.records import CURRENT, make_record, write_records

from dpstudy.analysis import collect, pivots
from dpstudy.report import figures as plots
from dpstudy.report import overview

BATCHES = (64, 128, 256, 512)
LRS = (0.01, 0.03, 0.1, 0.3)


def single_rate(batch: int, lr: float) -> float:
    return 1000.0 * batch / 64 + 100 * LRS.index(lr)


def ddp_speedup(batch: int, lr: float) -> float:
    return 1.2 + 0.2 * BATCHES.index(batch) + 0.05 * LRS.index(lr)


def accuracy(batch: int, lr: float, mode: str) -> float:
    return round(0.9 - 0.01 * BATCHES.index(batch) + 0.005 * LRS.index(lr) - (0.02 if mode == "ddp" else 0), 4)


DP_SPEEDUP = 1.1  # dp g2 at batch 64, lr 0.1: the square where two multi-device settings meet


def grid_records() -> list[dict]:
    """single g1 and ddp/gloo g2 at every batch x lr, plus one dp g2; one run each, throughputs exact."""
    records = []
    for batch in BATCHES:
        for lr in LRS:
            common = {"batch": batch, "lr": lr, "suffix": f"-lr{lr}"}
            records.append(
                make_record(
                    mode="single",
                    samples_per_s=single_rate(batch, lr),
                    accs=(0.5, accuracy(batch, lr, "single")),
                    **common,
                )
            )
            records.append(
                make_record(
                    mode="ddp",
                    gpus=2,
                    backend="gloo",
                    accs=(0.5, accuracy(batch, lr, "ddp")),
                    samples_per_s=single_rate(batch, lr) * ddp_speedup(batch, lr),
                    **common,
                )
            )
    records.append(
        make_record(
            mode="dp",
            gpus=2,
            batch=64,
            lr=0.1,
            suffix="-lr0.1",
            accs=(0.5, 0.8),
            samples_per_s=single_rate(64, 0.1) * DP_SPEEDUP,
        )
    )
    return records


@pytest.fixture(scope="module")
def tables(tmp_path_factory) -> dict[str, pd.DataFrame]:
    directory = tmp_path_factory.mktemp("grid")
    return collect.summarise(collect.collect(write_records(directory, grid_records()), CURRENT))


def markdown_tables(text: str) -> list[list[list[str]]]:
    """Every markdown table of `text` as rows of cells (header first, the --- line dropped)."""
    found, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            if not line.startswith("|---"):
                current.append([c.strip() for c in line.strip("|").split(" | ")])
        elif current:
            found.append(current)
            current = []
    return found


def entry(table: list[list[str]], row: str, column: str) -> str:
    header = table[0]
    return next(r for r in table[1:] if r[0] == row)[header.index(column)]


def test_the_two_keys_with_most_values_span_the_pivot(tables):
    assert overview.axis_keys(tables["settings"]) == ["batch", "lr"]  # global_batch restates batch


def test_speedup_pivot_entries_are_medians_of_the_settings_in_the_square(tables):
    text = overview.overview(tables)
    speedups = markdown_tables(text)[0]
    assert speedups[0][0] == "batch \\\\ lr"  # markdown_table escapes the backslash; the page shows one
    assert speedups[0][1:] == ["0.01", "0.03", "0.1", "0.3"]
    assert entry(speedups, "256", "0.03") == f"{ddp_speedup(256, 0.03):.2f}x ({ddp_speedup(256, 0.03) * 50:.0f} %)"
    # batch 64, lr 0.1: ddp/gloo and dp, both on 2 devices: the median of the two
    both = statistics.median([ddp_speedup(64, 0.1), DP_SPEEDUP])
    assert entry(speedups, "64", "0.1") == f"{both:.2f}x ({both * 50:.0f} %)"
    assert "median over the settings that differ only in `mode`, `backend`" in text


def test_accuracy_pivot_is_the_median_over_modes(tables):
    accuracies = markdown_tables(overview.overview(tables))[1]
    for batch, lr in ((128, 0.3), (512, 0.01)):
        expected = statistics.median([accuracy(batch, lr, "single"), accuracy(batch, lr, "ddp")])
        assert entry(accuracies, str(batch), str(lr)) == f"{expected * 100:.1f} %"
    three = statistics.median([accuracy(64, 0.1, "single"), accuracy(64, 0.1, "ddp"), 0.8])
    assert entry(accuracies, "64", "0.1") == f"{three * 100:.1f} %"


def test_highest_and_lowest_speedups_name_every_varied_key(tables):
    text = overview.overview(tables, limit=3)
    highest, lowest = markdown_tables(text)[2:4]
    assert highest[0][:7] == ["mode", "gpus", "batch", "backend", "lr", "devices", "global_batch"]
    assert len(highest) == 4 and len(lowest) == 4
    top = highest[1]
    assert top[:5] == ["ddp", "2", "512", "gloo", "0.3"]
    assert top[7].startswith(f"{ddp_speedup(512, 0.3):.2f}x")
    assert lowest[1][:5] == ["dp", "2", "64", "none", "0.1"]
    assert "`results/tables/settings.csv`" in text and "`results/tables/cells.csv`" in text


def test_a_few_settings_are_listed_whole_and_no_setting_is_said_so(tables):
    settings = tables["settings"].query("batch == 64 and lr == 0.01")
    few = {**tables, "settings": settings, **pivots.overview_tables(settings)}
    text = overview.overview(few)  # the findings list each of these: no medians over some of them
    assert "Each setting is listed with its interval in the sections below." in text and "median" not in text
    assert text.startswith("2 settings that differ in `mode` (2 values), `gpus` (2 values)")
    assert "**Every multi-device setting by speedup**" in overview.overview(few, small=0)
    empty = {**tables, "settings": tables["settings"].iloc[:0], **pivots.overview_tables(tables["settings"].iloc[:0])}
    assert overview.overview(empty).startswith("No setting finished")


def test_the_overview_phrases_the_pivot_table(tables):
    """The entries are the pivot table's medians, formatted: change one and the page says so."""
    pivot = tables["pivot"].copy()
    square = (pivot["of"] == "multi") & (pivot["row"] == 256) & (pivot["column"] == 0.03)
    assert pivot.loc[square, "speedup"].item() == pytest.approx(ddp_speedup(256, 0.03))
    assert pivot.loc[square, "settings"].item() == 1
    pivot.loc[square, ["speedup", "efficiency"]] = [9.99, 0.123]
    varied = tables["varied"].assign(values=tables["varied"]["values"] + 10)
    text = overview.overview({**tables, "pivot": pivot, "varied": varied})
    assert entry(markdown_tables(text)[0], "256", "0.03") == "9.99x (12 %)"
    assert "`batch` (14 values)" in text


def test_heat_map_squares_are_the_medians_of_the_settings(tables):
    fig = plots.FIGURES["overview.png"](tables)
    panels = {ax.get_title(): ax for ax in fig.axes}
    mesh = panels["ddp/gloo: speedup"].collections[0]
    # x: batch, y: lr (the two keys with most values), squares in ascending order of both
    expected = np.array([[ddp_speedup(b, lr) for b in BATCHES] for lr in LRS])
    assert np.asarray(mesh.get_array()).reshape(expected.shape) == pytest.approx(expected)
    accuracy_mesh = panels["single: final test accuracy"].collections[0]
    singles = np.array([[accuracy(b, lr, "single") for b in BATCHES] for lr in LRS])
    assert np.asarray(accuracy_mesh.get_array()).reshape(singles.shape) == pytest.approx(singles)
    assert "one device: the baseline (1x)" in [t.get_text() for t in panels["single: speedup"].texts]
    plt.close(fig)
