"""Why not n x: the step model's breakdown (dpstudy.analysis.scaling) on records whose parts are known
exactly (tests/helpers/records.py)."""

import math

import numpy as np
import pandas as pd
import pytest
from helpers.records import CURRENT, DDP_PAIR_PROBE, comm_fit, ddp_pair, make_record, write_records

from dpstudy.analysis import collect, scaling, stats, step_inputs

PROBE = DDP_PAIR_PROBE  # a step with its all-reduce 45 ms, without 35 ms
# the all-reduce of 4e5 B between 2 Gloo ranks at 0.02 GB/s: 20 ms
FITS = pd.DataFrame([comm_fit(0.0, 0.02)])
DDP = "synthetic-lenet-ddp-g2-b64-gloo"


@pytest.fixture
def tables(tmp_path):
    return collect.collect(write_records(tmp_path, ddp_pair()), CURRENT)  # its probe: 10 ms exposed


def model(tables, fits=FITS):
    settings = stats.settings_table(tables["cells"])
    return scaling.model(tables["cells"], tables["epochs"], settings, fits)


def test_the_parts_add_up_to_the_measured_step(tables):
    row = model(tables).set_index("cell").loc[DDP]
    step, data = 64 / 1500, 0.05 * 64 / 1500
    t1_64 = 0.064 * 0.98  # one device's step without its waiting for data
    assert row["step_s"] == pytest.approx(step) and row["ideal_s"] == pytest.approx(0.032)
    # one single-device batch: t1's line runs through the origin, t1(32) is half t1(64)
    assert row["t1_s"] == pytest.approx(t1_64 / 2) and row["fixed_s"] == 0
    assert row["exposed_s"] == pytest.approx(0.010) and row["exposed_source"] == "probe"
    assert row["data_s"] == pytest.approx(data) and row["transfers_s"] == 0
    # one DDP setting calibrates the host's share alone: whatever the other parts leave of its step
    assert row["sharing_s"] == pytest.approx(step - t1_64 / 2 - 0.010 - data)
    assert row["predicted_s"] == pytest.approx(step) and row["residual_s"] == pytest.approx(0, abs=1e-12)
    # the all-reduce priced by its fit: 20 ms, of which 10 ms exposed
    assert row["comm_s"] == pytest.approx(0.020) and row["overlap"] == pytest.approx(0.5)
    assert row["predicted_speedup"] == pytest.approx(0.064 / step) and row["measured_speedup"] == pytest.approx(1.5)
    losses = {k: row[k] for k in scaling.LOSSES if pd.notna(row[k])}
    assert losses["loss_compute_s"] == pytest.approx(0) and losses["loss_data_s"] == pytest.approx(data - 0.00128 / 2)
    assert row["ideal_s"] + sum(losses.values()) == pytest.approx(row["step_s"])
    assert row["largest"] == scaling.LOSSES["loss_exposed_s"]


def test_without_fits_the_collectives_are_not_priced_but_the_breakdown_stands(tables):
    row = model(tables, None).iloc[0]
    assert math.isnan(row["comm_s"]) and math.isnan(row["overlap"])
    assert row["exposed_s"] == pytest.approx(0.010) and row["residual_s"] == pytest.approx(0, abs=1e-12)


def test_the_trace_gives_the_exposed_communication_on_a_gpu_the_probe_on_a_cpu(tables):
    cells = tables["cells"].copy()
    cells.loc[cells["cell"] == DDP, "trace_exposed_comm_s"] = 0.004
    row = model({**tables, "cells": cells}).iloc[0]
    assert row["exposed_source"] == "probe" and row["exposed_s"] == pytest.approx(0.010)
    assert row["traced_exposed_s"] == pytest.approx(0.004)  # the trace's, beside it in the report
    # a CPU cell without a probe: its trace
    cells.loc[cells["cell"] == DDP, ["exposed_s", "sync_step_s", "nosync_step_s"]] = math.nan
    row = model({**tables, "cells": cells}).iloc[0]
    assert row["exposed_source"] == "trace" and row["exposed_s"] == pytest.approx(0.004)
    # on CUDA the trace first (dpstudy.analysis.step_inputs.EXPOSED_FROM), the probe where it has none
    cells = tables["cells"].assign(env_device="cuda")
    cells.loc[cells["cell"] == DDP, "trace_exposed_comm_s"] = 0.004
    parts = step_inputs.cell_parts(cells, tables["epochs"]).loc[DDP]
    assert parts["exposed_source"] == "trace" and parts["exposed_step_s"] == pytest.approx(0.004)
    parts = step_inputs.cell_parts(cells.assign(trace_exposed_comm_s=math.nan), tables["epochs"]).loc[DDP]
    assert parts["exposed_source"] == "probe" and parts["exposed_step_s"] == pytest.approx(0.010)


def test_without_a_probe_nothing_is_exposed_to_read_and_the_setting_is_not_modelled(tmp_path):
    """Records made before the probe existed: no exposed communication, so no calibration."""
    records = [
        make_record(mode="single", samples_per_s=1000.0, wait_frac=0.02),
        make_record(mode="ddp", gpus=2, backend="gloo", samples_per_s=1500.0, wait_frac=0.05),
    ]
    row = model(collect.collect(write_records(tmp_path, records), CURRENT)).iloc[0]
    assert row["exposed_source"] == "none" and math.isnan(row["exposed_s"]) and math.isnan(row["fixed_s"])
    assert math.isnan(row["predicted_s"]) and math.isnan(row["residual_s"]) and math.isnan(row["sharing_s"])
    assert row["loss_data_s"] == pytest.approx(0.05 * 64 / 1500 - 0.00128 / 2)


def test_cells_without_a_finished_baseline_are_left_out(tmp_path):
    records = [
        make_record("skipped", mode="single", reason="x"),
        make_record(mode="ddp", gpus=2, backend="gloo", probe=PROBE),
    ]
    assert model(collect.collect(write_records(tmp_path, records), CURRENT)).empty


def test_share_and_fixed_cost_come_from_two_batches_and_the_residual_names_what_they_miss(tmp_path):
    # one device: t1(b) = 2 ms + 0.1 ms x b; DDP at a global 64 and 256 (32 and 128 per rank): one
    # device's step 1.5x slower, 3 ms of fixed cost, 10 ms exposed; a third repeat of 256 runs 10 %
    # slower: its residual says so, the parts do not move
    def t1(b):
        return 0.002 + 1e-4 * b

    records = [make_record(mode="single", batch=b, samples_per_s=b / t1(b), wait_frac=0.0) for b in (64, 256)]
    for b in (64, 256):
        step = t1(b / 2) * 1.5 + 0.003 + 0.010
        slow = 1.1 if b == 256 else 1.0
        for k, scale in enumerate((1.0, 1.0, slow)):
            spec = {"mode": "ddp", "gpus": 2, "backend": "gloo", "batch": b, "repeat": k, "suffix": f"-r{k}"}
            records.append(make_record(samples_per_s=b / step / scale, wait_frac=0.0, probe=PROBE, **spec))
    tables = collect.collect(write_records(tmp_path, records), CURRENT)
    rows = model(tables).set_index("cell")
    # the setting at 256 calibrates on its repeats' geometric mean, 1.1^(1/3) slower than the law
    for _, row in rows.iterrows():
        assert row["step_s"] == pytest.approx(row["predicted_s"] + row["residual_s"])
        assert row["ideal_s"] + sum(row[k] for k in scaling.LOSSES if pd.notna(row[k])) == pytest.approx(row["step_s"])
    at_64 = rows.loc["synthetic-lenet-ddp-g2-b64-gloo-r0"]
    assert at_64["t1_s"] == pytest.approx(t1(32)) and at_64["exposed_s"] == pytest.approx(0.010)
    assert at_64["residual_s"] == pytest.approx(0, abs=1e-9)  # the line runs through both settings
    slow = rows.loc["synthetic-lenet-ddp-g2-b256-gloo-r2"]
    same = rows.loc["synthetic-lenet-ddp-g2-b256-gloo-r0"]
    assert slow["residual_s"] - same["residual_s"] == pytest.approx(slow["step_s"] - same["step_s"])
    assert slow["fixed_s"] == same["fixed_s"] and slow["sharing_s"] == same["sharing_s"]


def test_a_setting_is_broken_down_from_what_its_calibration_read(tmp_path):
    # three repeats, the last with a slow step and a long exposed time: a median of the repeats' own rows
    # would not add up; the setting's row takes its step from its quoted throughput (the geometric mean)
    records = [make_record(mode="single", samples_per_s=1000.0, repeat=s, suffix=f"-r{s}") for s in range(3)]
    probes = [PROBE, PROBE, {**PROBE, "sync_step_s": 0.065}]
    records += [
        make_record(mode="ddp", gpus=2, backend="gloo", samples_per_s=tput, probe=probe, repeat=s, suffix=f"-r{s}")
        for s, (tput, probe) in enumerate(zip((1400.0, 1500.0, 900.0), probes, strict=True))
    ]
    tables = collect.collect(write_records(tmp_path, records), CURRENT)
    settings = stats.settings_table(tables["cells"])
    table = scaling.settings_model(tables["cells"], tables["epochs"], settings, FITS)
    assert list(table.columns) == list(scaling.SETTING_MODEL_COLUMNS) and len(table) == 1
    row = table.iloc[0]
    ddp = settings[settings["mode"] == "ddp"].iloc[0]
    assert row["setting"] == ddp["setting"] and row["step_s"] == pytest.approx(64 / ddp["samples_per_s"])
    assert row["exposed_s"] == pytest.approx(0.010)  # the repeats' median
    assert row["residual_s"] == pytest.approx(0, abs=1e-12)  # one setting calibrates its own share
    parts = ["t1_s", "sharing_s", "fixed_s", "exposed_s", "data_s", "transfers_s", "residual_s"]
    assert sum(row[k] for k in parts) == pytest.approx(row["step_s"])
    # THE speedup of the setting (ratio of geometric means), with its interval
    expected = stats.ratio([1400.0, 1500.0, 900.0], [1000.0] * 3)
    assert (row["measured_speedup"], row["measured_speedup_low"]) == pytest.approx(expected[:2])
    assert row["predicted_speedup"] == pytest.approx(row["measured_speedup"])
    # the noise: the repeats' steps' standard deviation, the baseline's share in quadrature
    steps = [64 / t for t in (1400.0, 1500.0, 900.0)]
    assert row["noise_s"] == pytest.approx(float(np.std(steps, ddof=1)), rel=0.01)
    assert row["largest_s"] == pytest.approx(max(row[k] for k in scaling.LOSSES if pd.notna(row[k])))
    assert row["largest_s"] == pytest.approx(row[next(k for k, v in scaling.LOSSES.items() if v == row["largest"])])
    empty = scaling.settings_model(tables["cells"].iloc[:0], tables["epochs"].iloc[:0], settings.iloc[:0])
    assert empty.empty and list(empty.columns) == list(scaling.SETTING_MODEL_COLUMNS)


FSDP_PROBE = {
    "steps": 8,
    "sync_step_s": 0.050,
    "nosync_step_s": 0.035,  # the step on an unsharded replica: 15 ms exposed
    "allgather_s": 0.006,
    "reduce_scatter_s": 0.008,
    "gather_bytes": 200_000,
    "grad_bytes": 400_000,
    "units": 4,
}
# per unit: an all-gather of 5e4 B at 1 ms + 5e4 B / 0.05 GB/s = 2 ms, a reduce-scatter of 1e5 B at
# 0.5 ms + 1e5 B / 0.1 GB/s = 1.5 ms
FSDP_FITS = pd.DataFrame([comm_fit(1e-3, 0.05, "all_gather"), comm_fit(5e-4, 0.1, "reduce_scatter")])


@pytest.mark.parametrize("shard, comm_s", [("full", 4 * (2 * 0.002 + 0.0015)), ("grad_op", 4 * (0.002 + 0.0015))])
def test_fsdp_prices_its_all_gathers_and_reduce_scatter_per_unit(tmp_path, shard, comm_s):
    records = [
        make_record(mode="single", samples_per_s=1000.0, wait_frac=0.02),
        make_record(
            mode="fsdp", shard=shard, gpus=2, backend="gloo", samples_per_s=1500.0, wait_frac=0.05, probe=FSDP_PROBE
        ),
    ]
    row = model(collect.collect(write_records(tmp_path, records), CURRENT), FSDP_FITS).iloc[0]
    assert row["scheme"] == f"fsdp {shard}" and row["exposed_s"] == pytest.approx(0.015)
    assert row["comm_s"] == pytest.approx(comm_s) and row["overlap"] == pytest.approx(1 - 0.015 / comm_s)


def test_steps_that_compiled_leave_the_epoch_the_model_explains(tmp_path):
    """compile: true: the steps that compiled a graph sit inside the epoch's wall seconds; the model
    takes them out, as the throughput's steady window does, so that a 3 s compile is read neither
    as a slower step nor as waiting for data."""

    def compiled(rec, seconds):
        for epoch in rec["epochs"]:
            epoch.update(compile_s=seconds, wall_s=epoch["wall_s"] + seconds, compute_s=epoch["compute_s"] + seconds)
        return rec

    records = [
        compiled(make_record(mode="single", samples_per_s=1000.0, wait_frac=0.02, compile=True), 2.0),
        compiled(
            make_record(
                mode="ddp", gpus=2, backend="gloo", samples_per_s=1500.0, wait_frac=0.05, probe=PROBE, compile=True
            ),
            3.0,
        ),
    ]
    tables = collect.collect(write_records(tmp_path, records), CURRENT)
    assert sorted(tables["epochs"]["compile_s"]) == [2.0, 2.0, 3.0, 3.0]
    row = model(tables).iloc[0]
    # the same parts as without compiling (test_the_parts_add_up_to_the_measured_step)
    assert row["step_s"] == pytest.approx(64 / 1500) and row["ideal_s"] == pytest.approx(0.032)
    assert row["data_s"] == pytest.approx(0.05 * 64 / 1500) and row["t1_s"] == pytest.approx(0.064 * 0.98 / 2)
