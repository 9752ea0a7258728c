"""`make run` on this machine (the session's default study, tests/e2e/conftest.py): DDP over Gloo
with 1 and 2 processes, DP and NCCL skipped, three repeats of each, accuracy equal across modes,
every cell's memory predicted before training and measured after, the microbenchmarks, and a
report that renders offline in Chromium. The workflow runs against dpstudy installed with
`pip install .` (not editable): a workflow folder without the package, every job importing it
from site-packages."""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest
import torch
from helpers.bench import assert_kernel_rows
from helpers.browser import open_offline
from helpers.glossary import report_columns, undefined_in_glossary

from dpstudy.analysis import comm_fit, tablefiles
from dpstudy.analysis import floor as machine_floor
from dpstudy.microbench import comm
from dpstudy.record import provenance
from dpstudy.study import outputs
from dpstudy.util import allocator

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cells(default_study) -> pd.DataFrame:
    return pd.read_csv(default_study.workdir / "results/tables/cells.csv", dtype=tablefiles.TEXT["cells"]).set_index(
        "cell"
    )


def test_every_cell_ran_or_was_skipped_with_its_reason_and_the_modes_agree(default_study, cells):
    workdir = default_study.workdir
    assert set(cells["source_hash"]) == {provenance.source_hash()}  # the same code, wherever it lies
    ran = cells[cells["status"] == "ok"]
    ddp = ran[ran["mode"] == "ddp"]
    assert set(zip(ddp["gpus"], ddp["batch"], ddp["backend"])) == {
        (1, 64, "gloo"),
        (2, 64, "gloo"),
        (1, 256, "gloo"),
        (2, 256, "gloo"),
    }
    assert (ran["final_test_acc"] > 0.9).all() and (ddp["speedup"] > 0).all()
    # each against the single device at its global batch (the repeats' geometric mean; named by r0)
    assert (ddp["baseline"] == "synthetic-lenet-single-g1-b" + ddp["batch"].astype(str) + "-none-r0").all()
    assert sorted(ran["repeat"].unique()) == [0, 1, 2]
    skipped = cells[cells["status"] == "skipped"]
    assert set(skipped["mode"]) == {"dp", "ddp"} and set(skipped[skipped["mode"] == "ddp"]["backend"]) == {"nccl"}
    assert set(cells["status"]) == {"ok", "skipped"}
    chosen = allocator.resolve("auto")  # every rank of every cell: jemalloc where make test installed it
    assert set(ran["allocator"]) == {f"{chosen.name} ({chosen.library})" if chosen.library else chosen.name}
    settings = pd.read_csv(workdir / "results/tables/settings.csv")
    spread = settings.groupby("batch")["final_test_acc"].agg(lambda a: a.max() - a.min())
    assert (spread < 0.01).all(), f"accuracy differs across modes by {spread.to_dict()}"
    assert (settings["repeats"] == 3).all() and settings["speedup_low"].notna().any()
    assert len(pd.read_csv(workdir / "results/tables/scaling.csv")) == 6  # ddp g2 x 2 batches x 3 repeats
    for cell in cells.index:  # every job's log and Snakemake's benchmark of it
        assert (workdir / f"results/cells/{cell}/train.log").stat().st_size > 0
        assert (workdir / f"results/cells/{cell}/benchmark.tsv").exists()
    assert default_study.dry_run() == {}  # nothing left to do


def test_every_cells_memory_was_predicted_before_training_and_measured_after(default_study, cells):
    workdir = default_study.workdir
    # every cell's memory, predicted on the planning host (first by priority, not ordered before
    # training unless the study sets memory_budget_gib), beside what its step measured
    split = pd.read_csv(workdir / "results/tables/memory_split.csv")
    assert set(split["cell"]) == set(cells.index) and split["predicted_peak_mb"].gt(0).all()  # skipped ones too
    ran, measured = cells[cells["status"] == "ok"], split[split["peak_mb"].notna()]
    assert len(measured) == ran["devices"].sum() == 24 and set(measured["cell"]) == set(ran.index)
    assert measured["error_pct"].notna().all() and measured["error_pct"].abs().max() <= 15
    # the plan against every finished cell's tracked step: the target, 15 %
    accuracy = pd.read_csv(workdir / "results/tables/memory_accuracy.csv").set_index("mode")
    assert accuracy.loc["all", "devices"] == 24  # single, ddp g1: 6 cells each; ddp g2: 6 cells x 2 ranks
    assert accuracy.loc["all", "within_target"], accuracy.to_dict()
    # on a CPU no allocator peak exists: the comparison says it is the tracker's, and every rank
    # recorded how much its resident memory grew over the same step
    assert set(accuracy["against"]) == {"tracker"} and set(measured["against"]) == {"tracker"}
    assert measured["rss_growth_mb"].notna().all() and (measured["rss_growth_mb"] >= 0).all()


def test_the_report_answers_from_the_data_and_renders_offline_with_every_figure(default_study):
    workdir = default_study.workdir
    html = (workdir / "results/report/report.html").read_text()
    assert "quickstart" in html and "data:image/png;base64" in html
    assert "DDP (gloo) on 2 devices at batch 64: " in html and "Largest loss: <strong>" in html
    assert "mode dp needs CUDA" in html and "backend nccl needs CUDA" in html
    assert "<strong>Allocator</strong> " in html and " in every cell that ran" in html
    # the noise set against the machine at the cells' own moments (the gauge of every epoch)
    assert "Inside the cells, the same reference workload timed after every epoch moved by" in html
    page = open_offline(workdir / "results/report/report.html")
    figures = sorted(p.name for p in (workdir / "results/figures").glob("*.png"))
    # every figure of outputs.FIGURES and the two microbenchmarks', each shown in the report
    assert figures == sorted([*outputs.FIGURES, "comm.png", "kernels.png"])
    assert page["blocked"] == [] and len(page["images"]) == len(figures) == 15
    assert all(done and width > 100 for done, width in page["images"])


def test_every_multi_device_cell_carries_its_trace_and_the_report_reads_and_links_it(default_study, cells):
    workdir = default_study.workdir
    ran = cells[cells["status"] == "ok"]
    multi = ran[ran["devices"] > 1]
    assert len(multi) == 6 and multi["trace_step_s"].notna().all() and multi["trace_reason"].isna().all()
    assert ran[ran["devices"] == 1]["trace_step_s"].isna().all()  # one device: not traced by default
    parts = multi[["trace_data_wait_s", "trace_compute_s", "trace_exposed_comm_s", "trace_idle_s"]].sum(axis=1)
    assert np.allclose(parts, multi["trace_step_s"]) and (multi["trace_comm_s"] > 0).all()
    html = (workdir / "results/report/report.html").read_text()
    for cell, files in multi["trace_files"].items():
        paths = files.split("; ")  # every rank's, kept under results/, linked from results/report/
        assert paths == [f"cells/{cell}/trace/rank{r}.json.gz" for r in range(2)]
        assert all((workdir / "results" / p).stat().st_size > 1000 for p in paths)
    assert f'href="../{multi["trace_files"].iloc[0].split("; ")[0]}"' in html
    assert "The step as traced" in html and "step model ms: compute + exposed + data" in html
    # the step model's breakdown: on a CPU the exposed communication is the probe's (step_inputs.EXPOSED_FROM),
    # and at every measured setting the parts add up to the measured step within 5 %, the rest named residual
    scaling = pd.read_csv(workdir / "results/tables/scaling_settings.csv")
    assert len(scaling) == 2 and (scaling["exposed_source"] == "probe").all()
    assert (scaling["residual_s"].abs() <= 0.05 * scaling["step_s"]).all(), scaling[["step_s", "residual_s"]]
    parts = scaling[["t1_s", "sharing_s", "fixed_s", "exposed_s", "data_s", "transfers_s", "residual_s"]]
    assert np.allclose(parts.sum(axis=1), scaling["step_s"])


def test_every_column_the_report_shows_is_in_the_glossary(default_study):
    page = (default_study.workdir / "results/report/report.html").read_text()
    # the report's tables of settings, strategies, the step model, cells and microbenchmarks
    assert {"samples/s [95 %]", "step model", "hidden by the step", "job", "idle ms"} <= report_columns(page)
    assert undefined_in_glossary(page) == [], "define them in docs/glossary.md"


def test_the_microbenchmarks_wrote_every_row_and_the_ratios(default_study):
    # the extension they time: compiled by this run, or copied from this run's cache of builds
    build = json.loads((default_study.workdir / "results/ext/build.json").read_text())
    assert build["cache"].startswith(("compiled here, stored in ", "copied from ")), build["cache"]
    assert build["cache"].split(" ")[-1].startswith(os.environ["DPSTUDY_EXT_CACHE"])
    bench = default_study.workdir / "results/bench"
    assert_kernel_rows(pd.read_csv(bench / "kernels.csv"))

    df = pd.read_csv(bench / "comm.csv")
    assert list(df.columns) == comm.COLUMNS
    gloo = df[(df.backend == "gloo") & (df.device == "cpu")]
    assert list(gloo.collective.unique()) == list(comm.COLLECTIVES)
    # a reason-free row passed the check of its result on both ranks before it was timed
    assert gloo.reason.isna().all() and (gloo.median_s > 0).all() and (gloo.busbw_gbps > 0).all()
    assert (gloo.stream_s > 0).all()  # and the same calls back to back, as a backward pass issues them
    for collective, factor in (
        ("all_reduce", 2 * (2 - 1) / 2),
        ("all_gather", (2 - 1) / 2),
        ("reduce_scatter", (2 - 1) / 2),
    ):
        rows = gloo[gloo.collective == collective]
        assert list(rows.bytes) == [4096 * 4**k for k in range(9)], collective  # S, the total size
        assert list(rows["size"])[:6] == ["4 KiB", "16 KiB", "64 KiB", "256 KiB", "1 MiB", "4 MiB"]
        assert list(rows["size"])[6:] == ["16 MiB", "64 MiB", "256 MiB"]
        np.testing.assert_allclose(rows.algbw_gbps, rows.bytes / rows.median_s / 1e9, rtol=1e-12)
        np.testing.assert_allclose(rows.busbw_gbps, rows.bytes / rows.median_s / 1e9 * factor, rtol=1e-12)
    assert set(zip(df.collective, df.backend, df.device)) == {(c, *b) for c in comm.COLLECTIVES for b in comm.COMBOS}
    # each collective's latency + size / bandwidth fit over the 9 sizes (dpstudy.analysis.comm_fit)
    fits = pd.read_csv(default_study.workdir / "results/tables/comm_fit.csv")
    cpu_fits = fits[(fits.backend == "gloo") & (fits.device == "cpu")].set_index("collective")
    assert sorted(cpu_fits.index) == sorted(comm.COLLECTIVES) and (cpu_fits.world_size == 2).all()
    assert (cpu_fits.points == 9).all() and (cpu_fits.latency_s > 0).all() and (cpu_fits.bandwidth_gbps > 0).all()
    for collective, fit in cpu_fits.iterrows():  # the error it states is its error over the back-to-back sweep
        rows = gloo[gloo.collective == collective]
        errors = np.array([comm_fit.predicted_time(fit, b) for b in rows.bytes]) / rows.stream_s.to_numpy() - 1
        assert fit.rel_rmse == pytest.approx(np.sqrt(np.mean(errors**2))) and fit.max_rel_error == pytest.approx(
            np.abs(errors).max()
        )
    # each DDP setting on 2 ranks forecast from the other (dpstudy.analysis.calibration): B 64 is 32 per
    # rank, below the single devices' 64 and 256, B 256 is 128, between them
    table = pd.read_csv(default_study.workdir / "results/tables/forecasts.csv")
    held_out = table[table["source"] == "leave-one-out"].set_index("global_batch")
    assert sorted(held_out.index) == [64, 256] and (held_out["devices"] == 2).all()
    assert held_out.loc[64, "how"] == "extrapolated" and held_out.loc[256, "how"] == "interpolated"
    assert (held_out["predicted_low"] < held_out["predicted_samples_per_s"]).all()
    assert (held_out["predicted_samples_per_s"] < held_out["predicted_high"]).all()
    measured = held_out["measured_samples_per_s"]
    assert held_out["error"].to_numpy() == pytest.approx(held_out["predicted_samples_per_s"] / measured - 1)
    print("leave-one-out errors:", held_out["error"].round(3).to_dict())
    # and config.yaml's forecast: DDP and FSDP at 4 and 8 devices, batch 256, not run: Gloo
    # extrapolated from 2 ranks (FSDP with DDP's overlap: none of it ran), NCCL not forecast (no
    # NCCL cell ran here)
    asked = table[table["source"] == "requested"].set_index(["backend", "mode", "devices"])
    assert sorted(asked.index) == [(b, m, n) for b in ("gloo", "nccl") for m in ("ddp", "fsdp") for n in (4, 8)]
    gloo = asked.loc["gloo"]
    assert (gloo["how"] == "extrapolated").all() and (gloo["predicted_speedup"] > 0).all()
    ddp8 = gloo.loc[("ddp", 8), "basis"]
    assert "; 8 ranks extrapolated from 2; per-device batch 32 outside the measured 64-256" in ddp8
    assert "no fsdp full setting ran: DDP's host share and overlap" in gloo.loc[("fsdp", 8), "basis"]
    assert (gloo.xs("fsdp")["shard"] == "full").all() and (gloo.xs("ddp")["shard"] == "none").all()
    # FSDP's collectives cost more than DDP's all-reduce: on the same calibration, slower
    assert (gloo.xs("fsdp")["predicted_samples_per_s"] < gloo.xs("ddp")["predicted_samples_per_s"]).all()
    # ranked beside what ran in the strategies table (at batch 256) and the report, never as its fastest
    ranked = pd.read_csv(default_study.workdir / "results/tables/strategies.csv")
    beside = ranked[ranked["forecast"]]
    assert sorted(zip(beside["mode"], beside["devices"])) == [("ddp", 4), ("ddp", 8), ("fsdp", 4), ("fsdp", 8)]
    assert (beside["global_batch"] == 256).all() and beside["rank"].isna().all() and not beside["fastest"].any()
    assert sorted(ranked[ranked["global_batch"] == 256]["rank_with_forecasts"].dropna()) == [1, 2, 3, 4, 5, 6, 7]
    html = (default_study.workdir / "results/report/report.html").read_text()
    assert html.count("forecast, not run: ") == 4 and html.count(" of 7 (") == 4  # 3 that ran, 4 forecast
    nccl = asked.loc["nccl"]
    assert (nccl["how"] == "not forecast").all() and nccl["predicted_samples_per_s"].isna().all()
    skipped = df[df.reason.notna()]
    assert skipped.median_s.isna().all() and skipped.busbw_gbps.isna().all()
    if torch.cuda.device_count() < 2:
        assert (skipped.backend == "nccl").any()
        assert set(skipped[skipped.backend == "nccl"].collective) == set(comm.COLLECTIVES)


def test_the_machines_floor_ran_once_per_round_between_the_rounds_and_the_report_sets_the_noise_against_it(
    default_study, cells
):
    workdir = default_study.workdir
    runs = pd.read_csv(workdir / "results/tables/floor.csv")
    assert list(runs["repeat"]) == [0, 1, 2] and (runs["device"] == "cpu").all()
    assert (runs[list(machine_floor.RATES)] > 0).all().all() and (runs["seconds"] == 3).all()
    summary = pd.read_csv(workdir / "results/tables/summary.csv").iloc[0]
    assert summary["floor_runs"] == 3 and summary["floor_cv"] > 0
    parts = [summary[f"floor_{part}_cv"] for part in ("compute", "memory", "dispatch")]
    assert summary["floor_cv"] == max(parts)
    assert summary["floor_verdict"] in machine_floor.VERDICTS
    # spaced like the cells: round r's floor after round r's cells trained, before round r+1's did
    trained = cells[cells["status"] == "ok"]
    finished = {
        repeat: sorted((workdir / record).stat().st_mtime for record in trained[trained["repeat"] == repeat]["record"])
        for repeat in (0, 1, 2)
    }
    for repeat in (0, 1, 2):
        at = (workdir / outputs.floor_path(repeat)).stat().st_mtime
        assert finished[repeat][-1] < at and (repeat == 2 or at < finished[repeat + 1][0]), (repeat, at, finished)
    html = (workdir / "results/report/report.html").read_text()
    assert f"This machine&#x27;s floor is {summary['floor_cv'] * 100:.1f} %" in html or (
        f"This machine's floor is {summary['floor_cv'] * 100:.1f} %" in html
    )
