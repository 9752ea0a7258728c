"""Figures: every file of the registry is written, with many cells, few cells and none finished."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from dpstudy import collect, plots
from records import CURRENT, DP_REASON, NCCL_REASON, make_record, make_util, small_grid, write_records

REPO = Path(__file__).resolve().parent.parent
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def tables_of(directory: Path, records: list[dict]) -> dict[str, pd.DataFrame]:
    return collect.summarise(collect.collect(write_records(directory, records), CURRENT))


def gpu_records() -> list[dict]:
    """A second workload on GPUs: DP with unequal memory, both backends, utilisation samples."""
    common = {"model": "vgg", "device": "cuda", "batch": 128}
    return [
        make_record(mode="single", samples_per_s=900.0, util=make_util(1, [80.0]), **common),
        make_record(mode="dp", gpus=2, samples_per_s=1100.0, peak_mem=[300.0, 180.0], **common),
        make_record(mode="ddp", gpus=2, backend="nccl", samples_per_s=1700.0, util=make_util(2, [60.0, 58.0]), **common),
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
    assert set(plots.FIGURES) == {"throughput.png", "scaling.png", "model.png", "epoch_split.png",
                                  "accuracy_epochs.png", "accuracy_batch.png", "memory.png", "backends.png",
                                  "utilisation.png"}
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
def test_unfinished_cells_listed_with_reason(tmp_path, name):
    fig = plots.FIGURES[name](tables_of(tmp_path, small_grid()))
    text = figure_text(fig)
    plt.close(fig)
    assert NCCL_REASON in text
    if name != "backends.png":  # that figure lists only the DDP cells
        assert DP_REASON in text


def test_utilisation_says_when_nothing_was_sampled(tmp_path):
    fig = plots.utilisation(tables_of(tmp_path, small_grid()))
    assert "No GPU utilisation was sampled" in figure_text(fig)
    plt.close(fig)
    fig = plots.utilisation(tables_of(tmp_path / "gpu", gpu_records()))
    assert len(fig.axes) == 2 and fig.axes[0].lines  # one panel per sampled cell
    plt.close(fig)


def test_scaling_draws_the_ideal_line(tmp_path):
    fig = plots.scaling(tables_of(tmp_path, gpu_records()))
    speedup_ax = next(ax for ax in fig.axes if ax.get_ylabel() == plots.LABELS["speedup"])
    assert any(list(line.get_ydata()) == [1, 4] for line in speedup_ax.lines)  # 1 to 4 devices
    plt.close(fig)


def test_cli_writes_figures(tmp_path):
    skipped = [r for r in small_grid() if r["status"] == "skipped"]  # quick to draw
    collect.write_tables(tables_of(tmp_path, skipped), tmp_path / "tables")
    subprocess.run([sys.executable, str(REPO / "scripts" / "figures.py"), "--tables", str(tmp_path / "tables"),
                    "--out", str(tmp_path / "figures")], check=True, capture_output=True)
    assert sorted(p.name for p in (tmp_path / "figures").iterdir()) == sorted(plots.FIGURES)


def test_the_model_figure_puts_each_setting_at_predicted_and_measured_speedup(tmp_path):
    probe = {"steps": 8, "sync_step_s": 0.03, "nosync_step_s": 0.02, "allreduce_s": 0.02, "grad_bytes": 400_000}
    tables = tables_of(tmp_path, [make_record(mode="single", samples_per_s=1000.0),
                                  make_record(mode="ddp", gpus=2, backend="gloo", samples_per_s=1500.0, probe=probe)])
    fig = plots.model(tables)
    ax = fig.axes[0]
    points = [tuple(p) for c in ax.collections for p in c.get_offsets()]
    row = tables["scaling"].iloc[0]
    assert points == [pytest.approx((row["predicted_speedup"], 1.5))]
    assert any(list(line.get_ydata()) == [2, 2] for line in ax.lines)  # the ideal 2x
    plt.close(fig)
