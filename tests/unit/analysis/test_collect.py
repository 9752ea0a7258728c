"""Records -> tables: columns, speedup and its baseline, overhead, stale list, errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from helpers import REPO
from helpers.records import (
    CURRENT,
    DP_REASON,
    EVAL_S,
    NCCL_REASON,
    OOM_REASON,
    SAMPLES,
    STARTUP_S,
    TEARDOWN_S,
    make_record,
    make_util,
    small_grid,
    write_records,
)

from dpstudy.analysis import collect, tablefiles
from dpstudy.analysis.keys import SPEC_KEYS
from dpstudy.analysis.records import RecordError
from dpstudy.analysis.tables import CELL_COLUMNS, EPOCH_COLUMNS, PROBE_COLUMNS
from dpstudy.record.fields import PROBE_FIELDS
from dpstudy.study.outputs import TABLES


def tables_of(tmp_path: Path, records: list[dict]) -> dict[str, pd.DataFrame]:
    return collect.collect(write_records(tmp_path, records), CURRENT)


def by_cell(cells: pd.DataFrame) -> pd.DataFrame:
    return cells.set_index("cell")


@pytest.fixture
def grid(tmp_path: Path) -> dict[str, pd.DataFrame]:
    return tables_of(tmp_path, small_grid())


def test_one_row_per_cell_with_every_spec_key(grid):
    cells = grid["cells"]
    assert list(cells.columns) == list(CELL_COLUMNS)
    assert set(SPEC_KEYS) <= set(cells.columns)
    assert len(cells) == len(small_grid()) and cells["cell"].is_unique


def test_epochs_long_without_per_rank_list(grid):
    epochs = grid["epochs"]
    assert list(epochs.columns) == list(EPOCH_COLUMNS)
    assert "peak_mem_mb" not in epochs.columns
    assert len(epochs) == 4 * 2 + 1  # four ok cells of two epochs, the oom cell's first epoch
    first = epochs[epochs["cell"] == "synthetic-lenet-ddp-g2-b64-gloo"].iloc[0]
    assert first["warmup"] and first["peak_mem_mb_max"] == 120.0 and first["backend"] == "gloo"


def test_speedup_and_efficiency_against_single_device(grid):
    cells = by_cell(grid["cells"])
    b64, b256 = cells.loc["synthetic-lenet-ddp-g2-b64-gloo"], cells.loc["synthetic-lenet-ddp-g2-b256-gloo"]
    assert b64["baseline"] == "synthetic-lenet-single-g1-b64-none"
    assert b256["baseline"] == "synthetic-lenet-single-g1-b256-none"
    assert b64["speedup"] == pytest.approx(1.5) and b64["efficiency"] == pytest.approx(0.75)
    assert b256["speedup"] == pytest.approx(1.7) and b256["efficiency"] == pytest.approx(0.85)
    assert cells.loc["synthetic-lenet-single-g1-b64-none", "speedup"] == pytest.approx(1.0)


def test_unfinished_cells_have_no_speedup(grid):
    cells = by_cell(grid["cells"])
    assert cells.loc[["synthetic-lenet-dp-g2-b64-none", "synthetic-lenet-ddp-g2-b1024-gloo"], "speedup"].isna().all()


def test_per_device_batch_compares_with_the_same_batch_on_one_device(tmp_path):
    cells = by_cell(
        tables_of(
            tmp_path,
            [
                make_record(mode="single", batch=64, samples_per_s=1000.0),
                make_record(
                    mode="ddp", gpus=2, batch=64, backend="gloo", batch_scope="per_device", samples_per_s=1800.0
                ),
                make_record(mode="ddp", gpus=2, batch=128, backend="gloo", samples_per_s=1900.0),
            ],
        )["cells"]
    )
    per_device = cells.loc["synthetic-lenet-ddp-g2-b64-gloo"]
    assert per_device["global_batch"] == 128
    assert per_device["baseline"] == "synthetic-lenet-single-g1-b64-none"
    assert per_device["speedup"] == pytest.approx(1.8)
    no_single_b128 = cells.loc["synthetic-lenet-ddp-g2-b128-gloo"]
    assert pd.isna(no_single_b128["baseline"]) and pd.isna(no_single_b128["speedup"])


def test_baseline_averages_repeats_and_needs_equal_settings(tmp_path):
    cells = by_cell(
        tables_of(
            tmp_path,
            [
                make_record(mode="single", batch=64, repeat=0, samples_per_s=1000.0, suffix="-r0"),
                make_record(mode="single", batch=64, repeat=1, samples_per_s=1200.0, suffix="-r1"),
                make_record(mode="ddp", gpus=2, batch=64, backend="gloo", lr_scaling="linear", samples_per_s=2200.0),
                make_record(mode="ddp", gpus=2, batch=64, backend="nccl", lr=0.1, samples_per_s=2000.0),
            ],
        )["cells"]
    )
    linear = cells.loc["synthetic-lenet-ddp-g2-b64-gloo"]
    assert linear["baseline"] == "synthetic-lenet-single-g1-b64-none-r0"
    assert linear["speedup"] == pytest.approx(2200 / (1000 * 1200) ** 0.5)  # over the geometric mean of the repeats
    assert pd.isna(cells.loc["synthetic-lenet-ddp-g2-b64-nccl", "speedup"])  # no single cell at lr 0.1


def test_overhead_is_total_minus_epochs(grid):
    cell = by_cell(grid["cells"]).loc["synthetic-lenet-single-g1-b64-none"]
    epochs_s = 2 * (SAMPLES / 1000.0 + EVAL_S)
    assert cell["epochs_s"] == pytest.approx(epochs_s)
    assert cell["overhead_s"] == pytest.approx(STARTUP_S + TEARDOWN_S)
    assert cell["peak_mem_mb_max"] == cell["peak_mem_mb_min"] == 101.0


def test_skipped_and_oom_cells_kept_with_reason(grid, tmp_path):
    tablefiles.write_tables(grid, tmp_path / "tables")
    cells = by_cell(pd.read_csv(tmp_path / "tables" / "cells.csv"))
    assert cells.loc["synthetic-lenet-dp-g2-b64-none", ["status", "reason"]].tolist() == ["skipped", DP_REASON]
    assert cells.loc["synthetic-lenet-ddp-g2-b64-nccl", "reason"] == NCCL_REASON
    assert cells.loc["synthetic-lenet-ddp-g2-b1024-gloo", ["status", "reason"]].tolist() == ["oom", OOM_REASON]
    assert pd.isna(cells.loc["synthetic-lenet-dp-g2-b64-none", "samples_per_s"])


def test_stale_cells_listed_for_forcerun(tmp_path):
    paths = write_records(tmp_path, small_grid())
    tables = collect.collect(paths, CURRENT)
    stale = tables["cells"].loc[tables["cells"]["stale"], "cell"].tolist()
    assert stale == ["synthetic-lenet-single-g1-b256-none"]
    written = tablefiles.write_tables(tables, tmp_path / "tables")
    assert {p.name for p in written} == {
        "cells.csv",
        "epochs.csv",
        "ranks.csv",
        "util.csv",
        "memory_split.csv",
        "stale.txt",
        "unreadable.txt",
    }
    assert (tmp_path / "tables" / "stale.txt").read_text() == f"{paths[1]}\n"
    current = collect.collect(paths, {"git_commit": None, "source_hash": "old000000000"})
    assert current["cells"]["stale"].sum() == len(paths) - 1


def test_stale_file_empty_when_nothing_is_stale(tmp_path):
    tables = tables_of(tmp_path, [make_record(mode="single")])
    tablefiles.write_tables(tables, tmp_path / "tables")
    assert (tmp_path / "tables" / "stale.txt").read_text() == ""


def test_ranks_long_and_util_header_only_without_samples(grid, tmp_path):
    ranks = grid["ranks"]
    assert list(ranks.columns) == ["cell", "epoch", "rank", "peak_mem_mb"]
    ddp = ranks[(ranks["cell"] == "synthetic-lenet-ddp-g2-b64-gloo") & (ranks["epoch"] == 2)]
    assert ddp["peak_mem_mb"].tolist() == [120.0, 119.0]
    tablefiles.write_tables(grid, tmp_path / "tables")
    assert (tmp_path / "tables" / "util.csv").read_text().strip() == "cell,device,t,gpu_util,mem_util,mem_mb"


def test_util_samples_per_device(tmp_path):
    util = tables_of(
        tmp_path, [make_record(mode="ddp", gpus=2, backend="nccl", device="cuda", util=make_util(2, [60.0, 58.0]))]
    )["util"]
    assert len(util) == 12 and sorted(util["device"].unique()) == [0, 1]
    assert util.groupby("device")["gpu_util"].mean().tolist() == [60.0, 58.0]


def test_unreadable_record_is_an_error_naming_the_file(tmp_path):
    good = write_records(tmp_path, [make_record()])
    broken = tmp_path / "broken" / "record.json"
    broken.parent.mkdir()
    broken.write_text("{not json")
    with pytest.raises(RecordError, match=str(broken)):
        collect.collect([*good, broken], CURRENT)
    invalid = tmp_path / "invalid.json"
    invalid.write_text(json.dumps({**make_record(), "status": "done"}))
    with pytest.raises(RecordError, match=f"{invalid}.*'done'"):
        collect.collect([invalid], CURRENT)
    with pytest.raises(RecordError, match="missing.json"):
        collect.collect([tmp_path / "missing.json"], CURRENT)


def test_duplicate_cell_is_an_error(tmp_path):
    first = write_records(tmp_path / "a", [make_record()])
    second = write_records(tmp_path / "b", [make_record()])
    with pytest.raises(RecordError, match="already came from"):
        collect.collect(first + second, CURRENT)


def test_cli_reads_a_record_list_and_reports_bad_files(tmp_path):
    paths = write_records(tmp_path, small_grid())
    listing = tmp_path / "records.txt"
    listing.write_text("\n".join(map(str, paths[1:])) + "\n")
    script = [sys.executable, str(REPO / "scripts" / "collect.py")]
    subprocess.run(
        [*script, "--records", str(paths[0]), "--records-from", str(listing), "--out-dir", str(tmp_path / "tables")],
        check=True,
        capture_output=True,
    )
    assert len(pd.read_csv(tmp_path / "tables" / "cells.csv")) == len(paths)
    assert sorted(p.name for p in (tmp_path / "tables").glob("*.csv")) == sorted(f"{n}.csv" for n in TABLES)
    assert pd.read_csv(tmp_path / "tables" / "summary.csv")["multi_settings"].tolist() == [2]  # ddp g2 b64, b256
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    run = subprocess.run(
        [*script, "--records", str(bad), "--out-dir", str(tmp_path / "t2")], capture_output=True, text=True
    )
    assert run.returncode != 0 and str(bad) in run.stderr and not (tmp_path / "t2" / "cells.csv").exists()
    assert f"rerun exactly that cell with `snakemake --cores 1 --forcerun {bad}`" in run.stderr
    # --keep-going (the workflow's: DPSTUDY_KEEP_GOING=1): the rest collected, the bad one listed
    for flag, env in ((["--keep-going"], {}), ([], {"DPSTUDY_KEEP_GOING": "1"})):
        out = tmp_path / f"t3{len(flag)}"
        run = subprocess.run(
            [*script, "--records", str(bad), *map(str, paths), "--out-dir", str(out), *flag],
            capture_output=True,
            text=True,
            env={**os.environ, **env},
        )
        assert run.returncode == 0, run.stderr
        assert len(pd.read_csv(out / "cells.csv")) == len(paths)
        (line,) = (out / "unreadable.txt").read_text().splitlines()
        assert line.startswith(f"{bad}: not a valid record: ") and line.endswith(f"--forcerun {bad}`")
        assert f"warning: left out (--keep-going): {line}" in run.stderr
    assert (tmp_path / "tables" / "unreadable.txt").read_text() == ""  # none unreadable: an empty list


def test_multi_node_cells_count_every_device_of_the_world(tmp_path):
    cells = by_cell(
        tables_of(
            tmp_path,
            [
                make_record(mode="single", batch=64, samples_per_s=1000.0),
                make_record(mode="ddp", gpus=2, nodes=2, batch=64, backend="gloo", samples_per_s=3000.0),
            ],
        )["cells"]
    )
    multi = cells.loc["synthetic-lenet-ddp-g2-b64-gloo-nodes2"]
    assert (multi["nodes"], multi["devices"], multi["world_size"], multi["global_batch"]) == (2, 4, 4, 64)
    assert multi["baseline"] == "synthetic-lenet-single-g1-b64-none"
    assert multi["speedup"] == pytest.approx(3.0) and multi["efficiency"] == pytest.approx(0.75)
    assert multi["scheduler"] == "slurm" and multi["job_id"] == "7" and multi["rank_nodes"] == "n1; n2"
    assert cells.loc["synthetic-lenet-single-g1-b64-none", "rank_nodes"] == "testhost"


def test_a_packed_cell_keeps_its_pack_and_estimate_through_the_table_on_disk(tmp_path):
    packed = make_record(mode="ddp", gpus=1, nodes=2, backend="gloo")  # a SLURM job, id 7
    packed["env"]["job"] |= {"pack": "pack-2n-0", "estimated_s": 95.5}
    own = make_record(mode="single")  # records before packing have neither
    cells = tables_of(tmp_path / "records", [packed, own])["cells"]
    tablefiles.write_tables({name: cells if name == "cells" else pd.DataFrame({"x": [1]}) for name in TABLES}, tmp_path)
    for table in (cells, tablefiles.read_tables(tmp_path)["cells"]):
        table = by_cell(table)
        assert table.loc[packed["cell"], ["job_id", "pack", "estimated_s"]].tolist() == ["7", "pack-2n-0", 95.5]
        assert table.loc[own["cell"], ["pack", "estimated_s"]].isna().all()
        assert table["estimated_s"].dtype == float


def test_records_from_before_a_setting_existed_get_its_default(tmp_path):
    old = make_record(mode="ddp", gpus=2, batch=64, backend="gloo")
    del old["spec"]["nodes"]
    cells = by_cell(tables_of(tmp_path, [old])["cells"])
    assert cells.loc["synthetic-lenet-ddp-g2-b64-gloo", ["nodes", "devices"]].tolist() == [1, 2]


def test_probe_fields_become_columns_but_how_the_probe_ran_does_not(tmp_path):
    probe = {"steps": 8, "sync_step_s": 0.045, "nosync_step_s": 0.035, "allreduce_s": 0.020, "grad_bytes": 400_000}
    cells = tables_of(
        tmp_path, [make_record(mode="single"), make_record(mode="ddp", gpus=2, backend="gloo", probe=probe)]
    )
    cells = by_cell(cells["cells"])
    assert PROBE_COLUMNS == tuple(k for k in PROBE_FIELDS if k not in ("steps", "rounds", "graphs_compiled"))
    assert list(cells.columns[-len(PROBE_COLUMNS) :]) == list(PROBE_COLUMNS)
    ddp = cells.loc["synthetic-lenet-ddp-g2-b64-gloo"]
    assert ddp[["sync_step_s", "allreduce_s", "grad_bytes"]].tolist() == [0.045, 0.020, 400_000.0]
    assert ddp[["allgather_s", "units", "scatter_s"]].isna().all()
    assert cells.loc["synthetic-lenet-single-g1-b64-none", list(PROBE_COLUMNS)].isna().all()


def test_a_cells_trace_becomes_columns_with_its_files_under_the_results_folder(tmp_path):
    ranks = [
        {"rank": r, "steps": 4, "activity": "cpu", "step_s": 0.010, "data_wait_s": 0.0, "compute_s": 0.006 + r / 1000,
         "exposed_comm_s": 0.003 - r / 1000, "idle_s": 0.001, "comm_s": 0.004, "overlap": 0.25, "collectives": {},
         "file": f"trace/rank{r}.json.gz", "bytes": 5000, "reason": None}
        for r in range(2)
    ]  # fmt: skip
    pace = {k: v for k, v in ranks[1].items() if k not in ("rank", "steps", "activity", "file", "bytes", "reason")}
    traced = make_record(mode="ddp", gpus=2, backend="gloo")
    traced["trace"] = {"steps": 4, "pace_rank": 1, **pace, "reason": None, "ranks": ranks}
    cells = by_cell(tables_of(tmp_path, [make_record(mode="single"), traced])["cells"])
    ddp = cells.loc["synthetic-lenet-ddp-g2-b64-gloo"]
    assert ddp[["trace_step_s", "trace_compute_s", "trace_exposed_comm_s"]].tolist() == [0.010, 0.007, 0.002]
    cell = "synthetic-lenet-ddp-g2-b64-gloo"
    assert ddp["trace_files"] == f"cells/{cell}/trace/rank0.json.gz; cells/{cell}/trace/rank1.json.gz"
    assert cells.loc["synthetic-lenet-single-g1-b64-none", ["trace_step_s", "trace_files"]].isna().all()
