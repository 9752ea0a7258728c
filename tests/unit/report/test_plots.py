"""Figures: every file of the registry is written, with many cells, few cells and none finished."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from helpers import REPO
from helpers.plots import errorbars, repeated, tables_of
from helpers.records import (
    CURRENT,
    DP_REASON,
    NCCL_REASON,
    make_record,
    make_util,
    small_grid,
    strategy_grid,
    strategy_plan,
    write_records,
)
from matplotlib.collections import PathCollection

from dpstudy.analysis import collect, tablefiles
from dpstudy.report import figures as plots
from dpstudy.report.figures import layout

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def copied(tables: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """A test's own copy of tables the module collected once."""
    return {name: table.copy() for name, table in tables.items()}


@pytest.fixture(scope="module")
def grid_collected(tmp_path_factory) -> dict[str, pd.DataFrame]:
    return tables_of(tmp_path_factory.mktemp("grid"), small_grid())


@pytest.fixture
def grid_tables(grid_collected) -> dict[str, pd.DataFrame]:
    """small_grid's tables: the CPU study with unfinished cells."""
    return copied(grid_collected)


@pytest.fixture(scope="module")
def gpu_collected(tmp_path_factory) -> dict[str, pd.DataFrame]:
    return tables_of(tmp_path_factory.mktemp("gpu"), gpu_records())


@pytest.fixture
def gpu_tables(gpu_collected) -> dict[str, pd.DataFrame]:
    """gpu_records' tables."""
    return copied(gpu_collected)


def gpu_records() -> list[dict]:
    """A second workload on GPUs: DP with unequal memory, both backends, utilisation samples."""
    common = {"model": "vgg", "device": "cuda", "batch": 128}
    return [
        make_record(mode="single", samples_per_s=900.0, util=make_util(1, [80.0]), **common),
        make_record(mode="dp", gpus=2, samples_per_s=1100.0, peak_mem=[300.0, 180.0], **common),
        make_record(
            mode="ddp", gpus=2, backend="nccl", samples_per_s=1700.0, util=make_util(2, [60.0, 58.0]), **common
        ),
        make_record(mode="ddp", gpus=2, backend="gloo", samples_per_s=1300.0, **common),
        make_record(mode="ddp", gpus=4, backend="nccl", samples_per_s=3000.0, **common),
    ]


def assert_pngs(paths: list[Path], out: Path) -> None:
    assert [p.name for p in paths] == list(plots.FIGURES)
    for name in plots.FIGURES:
        data = (out / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 5000, name
    assert not [p for p in out.iterdir() if p.name.startswith(".")], "temporary files left behind"


def figure_text(fig) -> str:
    return "\n".join(t.get_text() for t in fig.findobj(plt.Text))


def test_registry_names_png_files():
    assert set(plots.FIGURES) == {
        "overview.png",
        "throughput.png",
        "scaling.png",
        "model.png",
        "forecasts.png",
        "epoch_split.png",
        "accuracy_epochs.png",
        "accuracy_batch.png",
        "memory.png",
        "memory_split.png",
        "strategies.png",
        "backends.png",
        "utilisation.png",
    }
    assert all(callable(f) for f in plots.FIGURES.values())


def test_every_figure_with_many_cells(tmp_path):
    tables = tables_of(tmp_path, small_grid() + gpu_records())
    out = tmp_path / "figures"
    assert_pngs(plots.render(tables, out), out)


def test_every_figure_when_no_cell_finished(tmp_path):
    tables = tables_of(tmp_path, [r for r in small_grid() if r["status"] == "skipped"])
    out = tmp_path / "figures"
    assert_pngs(plots.render(tables, out), out)


def test_every_figure_with_one_cell(tmp_path):
    tables = tables_of(tmp_path, [make_record(mode="single", epochs=1, accs=(0.5,))])
    out = tmp_path / "figures"
    assert_pngs(plots.render(tables, out), out)


@pytest.mark.parametrize("name", list(plots.FIGURES))
def test_unfinished_cells_listed_with_reason(grid_tables, name):
    fig = plots.FIGURES[name](grid_tables)
    text = figure_text(fig)
    plt.close(fig)
    assert NCCL_REASON in text
    if name != "backends.png":  # that figure lists only the DDP cells
        assert DP_REASON in text


def test_utilisation_says_when_nothing_was_sampled(grid_tables, gpu_tables):
    fig = plots.FIGURES["utilisation.png"](grid_tables)
    assert "No GPU utilisation was sampled" in figure_text(fig)
    plt.close(fig)
    fig = plots.FIGURES["utilisation.png"](gpu_tables)
    assert len(fig.axes) == 2 and fig.axes[0].lines  # one panel per sampled cell
    plt.close(fig)


def test_scaling_draws_the_ideal_line(gpu_tables):
    fig = plots.FIGURES["scaling.png"](gpu_tables)
    speedup_ax = next(ax for ax in fig.axes if ax.get_ylabel() == layout.LABELS["speedup"])
    assert any(list(line.get_ydata()) == [1, 4] for line in speedup_ax.lines)  # 1 to 4 devices
    plt.close(fig)


def test_cli_writes_figures(tmp_path):
    skipped = [r for r in small_grid() if r["status"] == "skipped"]  # quick to draw
    tablefiles.write_tables(tables_of(tmp_path, skipped), tmp_path / "tables")
    subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "figures.py"),
            "--tables",
            str(tmp_path / "tables"),
            "--out",
            str(tmp_path / "figures"),
        ],
        check=True,
        capture_output=True,
    )
    assert sorted(p.name for p in (tmp_path / "figures").iterdir()) == sorted(plots.FIGURES)


def test_the_model_figure_puts_each_setting_at_predicted_and_measured_speedup(tmp_path):
    probe = {"steps": 8, "sync_step_s": 0.03, "nosync_step_s": 0.02, "allreduce_s": 0.02, "grad_bytes": 400_000}
    tables = tables_of(
        tmp_path,
        [
            make_record(mode="single", samples_per_s=1000.0),
            make_record(mode="ddp", gpus=2, backend="gloo", samples_per_s=1500.0, probe=probe),
        ],
    )
    fig = plots.FIGURES["model.png"](tables)
    ax = fig.axes[0]
    points = [tuple(p) for c in ax.collections for p in c.get_offsets()]
    row = tables["scaling"].iloc[0]
    assert points == [pytest.approx((row["predicted_speedup"], 1.5))]
    assert any(list(line.get_ydata()) == [2, 2] for line in ax.lines)  # the ideal 2x
    plt.close(fig)


@pytest.fixture
def repeats_tables(tmp_path) -> dict[str, pd.DataFrame]:
    """single g1 and ddp/gloo g2 at batch 64, three repeats each (their speedup has an interval),
    and ddp/gloo g2 at batch 256 run once (no interval)."""
    return tables_of(
        tmp_path,
        [
            *repeated([1000.0, 1040.0, 960.0], mode="single"),
            *repeated([1500.0, 1620.0, 1410.0], mode="ddp", gpus=2, backend="gloo"),
            make_record(mode="single", batch=256, samples_per_s=2000.0),
            make_record(mode="ddp", gpus=2, backend="gloo", batch=256, samples_per_s=3400.0),
        ],
    )


def test_scaling_draws_the_settings_tables_speedup_and_interval(repeats_tables):
    settings = repeats_tables["settings"].query("devices == 2").set_index("batch")
    fig = plots.FIGURES["scaling.png"](repeats_tables)
    axes = {ax.get_ylabel(): ax for ax in fig.axes if ax.get_ylabel()}
    for metric in ("speedup", "efficiency"):
        drawn = errorbars(axes[layout.LABELS[metric]])
        b64, b256 = settings.loc[64], settings.loc[256]
        assert b64[f"{metric}_low"] < b64[metric] < b64[f"{metric}_high"]
        points = [p for points, _ in drawn for p in points]
        assert (2, pytest.approx(b64[metric])) in points and (2, pytest.approx(b256[metric])) in points
        bars = [s for _, segments in drawn for s in segments if np.isfinite(s).all()]
        # the one interval there is, b64's: b256 ran once and gets no bar
        assert bars == [[[2, pytest.approx(b64[f"{metric}_low"])], [2, pytest.approx(b64[f"{metric}_high"])]]]
    plt.close(fig)


def test_throughput_marks_every_setting_with_the_tables_interval(repeats_tables):
    settings = repeats_tables["settings"]
    fig = plots.FIGURES["throughput.png"](repeats_tables)
    drawn = errorbars(fig.axes[0])
    points = sorted(p for points, _ in drawn for p in points)
    expected = sorted(zip(settings["global_batch"], settings["samples_per_s"]))
    assert points == [(b, pytest.approx(v)) for b, v in expected]
    bars = [s for _, segments in drawn for s in segments]
    expected = [
        [[64, pytest.approx(r.samples_per_s_low)], [64, pytest.approx(r.samples_per_s_high)]]
        for r in settings.query("global_batch == 64").itertuples()
    ]
    assert len(bars) == 2 and all(bar in expected for bar in bars)
    plt.close(fig)


def test_the_model_figure_draws_the_measured_speedups_interval(tmp_path):
    probe = {"steps": 8, "sync_step_s": 0.03, "nosync_step_s": 0.02, "allreduce_s": 0.02, "grad_bytes": 400_000}
    tables = tables_of(
        tmp_path,
        [
            *repeated([1000.0, 1040.0, 960.0], mode="single"),
            *repeated([1500.0, 1620.0, 1410.0], mode="ddp", gpus=2, backend="gloo", probe=probe),
        ],
    )
    row = tables["scaling_settings"].iloc[0]
    ddp = tables["settings"].query("mode == 'ddp'").iloc[0]  # the bar is the setting's own interval
    assert (row["measured_speedup_low"], row["measured_speedup_high"]) == (ddp["speedup_low"], ddp["speedup_high"])
    fig = plots.FIGURES["model.png"](tables)
    lines = [list(line.get_ydata()) for line in fig.axes[0].lines]
    assert any(
        ys[:2] == [pytest.approx(row["measured_speedup_low"]), pytest.approx(row["measured_speedup_high"])]
        for ys in lines
        if len(ys) == 3
    )
    plt.close(fig)


@pytest.fixture(scope="module")
def many_settings(tmp_path_factory) -> dict[str, pd.DataFrame]:
    """15 learning rates x batch 64, 128 x single, ddp/gloo g2: 60 settings, each cell GPU-sampled."""
    records = []
    for lr in [round(0.01 * (i + 1), 2) for i in range(15)]:
        for batch in (64, 128):
            for mode, gpus, backend, speedup in (("single", 1, "none", 1.0), ("ddp", 2, "gloo", 1.6)):
                records.append(
                    make_record(
                        mode=mode,
                        gpus=gpus,
                        backend=backend,
                        batch=batch,
                        lr=lr,
                        suffix=f"-lr{lr}",
                        samples_per_s=1000.0 * batch / 64 * speedup,
                        util=make_util(gpus, [50.0 + 100 * lr] * gpus),
                    )
                )
    return tables_of(tmp_path_factory.mktemp("many"), records)


def test_bar_figures_fold_many_settings_into_a_screen(many_settings):
    for make in (plots.FIGURES["epoch_split.png"], plots.FIGURES["memory.png"]):
        fig = make(many_settings)
        ax = fig.axes[0]
        labels = [t.get_text() for t in ax.get_yticklabels()]
        assert labels == ["ddp g2 b64 gloo", "ddp g2 b128 gloo", "single g1 b64", "single g1 b128"]
        assert "medians over settings that differ in lr" in fig._suptitle.get_text()
        assert fig.get_figheight() <= layout.MAX_HEIGHT + 0.5
        plt.close(fig)


def test_line_figures_spread_settings_that_differ_in_a_hidden_key(many_settings):
    fig = plots.FIGURES["throughput.png"](many_settings)
    texts = [t.get_text() for t in fig.legends[0].texts]
    assert "line: median over lr" in texts
    points = [p for points, _ in errorbars(fig.axes[0]) for p in points]
    at_64 = sorted(x for x, _ in points if 64 / 2**layout.SPREAD <= x <= 64 * 2**layout.SPREAD)
    assert len(at_64) == 30 and len(set(at_64)) == 15  # single and ddp, 15 learning rates spread around 64
    plt.close(fig)


def test_utilisation_shows_a_few_cells_when_many_were_sampled(many_settings):
    fig = plots.FIGURES["utilisation.png"](many_settings)
    assert len([ax for ax in fig.axes if ax.lines]) == layout.MAX_PANELS
    assert f"{layout.MAX_PANELS} of 60 sampled cells" in fig._suptitle.get_text()
    plt.close(fig)


def test_accuracy_per_epoch_draws_medians_when_cells_are_many(many_settings):
    fig = plots.FIGURES["accuracy_epochs.png"](many_settings)
    assert len(fig.axes[0].lines) < layout.MAX_LINES
    assert "the median of its cells (60 in all)" in fig._suptitle.get_text()
    plt.close(fig)


@pytest.fixture(scope="module")
def strategy_collected(tmp_path_factory) -> dict[str, pd.DataFrame]:
    records = strategy_grid()
    directory = tmp_path_factory.mktemp("strategies")
    return collect.summarise(collect.collect(write_records(directory, records), CURRENT, strategy_plan(records)))


@pytest.fixture
def strategy_tables(strategy_collected) -> dict[str, pd.DataFrame]:
    """strategy_grid's tables, with the memory plan beside them."""
    return copied(strategy_collected)


def test_strategies_places_each_strategy_at_its_memory_and_throughput_and_rings_the_fastest(strategy_tables):
    tables = strategy_tables
    fig = plots.FIGURES["strategies.png"](tables)
    drawn = {
        (round(x, 6), round(y, 6))
        for ax in fig.axes
        for line in ax.lines
        for x, y in zip(line.get_xdata(), line.get_ydata())
        if line.get_marker() in ("o", "s")
    }
    ran = tables["strategies"].dropna(subset=["rank"])
    assert drawn == {(round(m, 6), round(s, 6)) for m, s in zip(ran["memory_mb"], ran["samples_per_s"])}
    best = ran[ran["rank"] == 1].iloc[0]
    rings = [
        c.get_offsets().tolist()
        for ax in fig.axes
        for c in ax.collections
        if isinstance(c, PathCollection) and len(c.get_offsets())
    ]
    assert rings == [[[best["memory_mb"], best["samples_per_s"]]]]
    assert "predicted 93.10 GiB > 70 GiB per device" in figure_text(fig)  # the cell that did not fit, listed
    plt.close(fig)


def test_memory_split_stacks_the_measured_parts_and_marks_the_prediction(strategy_tables):
    tables = strategy_tables
    fig = plots.FIGURES["memory_split.png"](tables)
    ax = fig.axes[0]
    widths = sorted(round(p.get_width(), 6) for p in ax.patches if p.get_width() > 0)
    split = tables["memory_split"].dropna(subset=["peak_mb"])
    single_rows = split[split["cell"].str.contains("single")]
    assert single_rows["peak_mb"].tolist() == [100.0] * len(single_rows)
    # the one-device bars: 10 + 10 + 20 + 60 MB; the ticks: the plan's peaks (10 % above the measured)
    assert {10.0, 20.0, 60.0} <= set(widths)
    ticks = sorted(round(x, 6) for c in ax.collections if isinstance(c, PathCollection) for x, _ in c.get_offsets())
    settings = split.assign(setting=split["cell"].str.replace(r"-r\d+$", "", regex=True))
    expected = settings.groupby(["setting", "device"])["predicted_peak_mb"].median()
    assert ticks == sorted(round(v, 6) for v in expected)
    plt.close(fig)
