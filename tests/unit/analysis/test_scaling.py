"""The "why not N x" model on records whose parts are known exactly (tests/helpers/records.py)."""

import math

import pandas as pd
import pytest
from helpers.records import CURRENT, make_record, write_records

from dpstudy.analysis import collect, scaling, stats

PROBE = {"steps": 8, "sync_step_s": 0.045, "nosync_step_s": 0.035, "allreduce_s": 0.020, "grad_bytes": 400_000}
# gloo on CPU between 2 processes: 0.1 GB/s bus bandwidth at every size -> 4e5 B x 2(2-1)/2 / 1e8 B/s = 4 ms
COMM = pd.DataFrame(
    {"backend": "gloo", "device": "cpu", "world_size": 2, "bytes": [4096, 4 << 20], "busbw_gbps": 0.1, "reason": None}
)


@pytest.fixture
def tables(tmp_path):
    # single: 6000 samples at 1000/s -> 6.0 s epochs, 2 % waiting (0.12 s), 5.88 s computing
    # ddp g2: 1500/s -> 4.0 s epochs, 5 % waiting (0.2 s)
    records = [
        make_record(mode="single", samples_per_s=1000.0, wait_frac=0.02),
        make_record(mode="ddp", gpus=2, backend="gloo", samples_per_s=1500.0, wait_frac=0.05, probe=PROBE),
    ]
    return collect.collect(write_records(tmp_path, records), CURRENT)


def test_the_parts_and_the_prediction(tables):
    row = (
        scaling.model(tables["cells"], tables["epochs"], COMM).set_index("cell").loc["synthetic-lenet-ddp-g2-b64-gloo"]
    )
    assert row["steps"] == math.ceil(3000 / 32) == 94
    assert row["ideal_s"] == pytest.approx(3.0) and row["compute_s"] == pytest.approx(2.94)
    assert row["data_wait_s"] == pytest.approx(0.2)
    assert row["overlap"] == pytest.approx(0.5)  # 1 - (45 - 35 ms) / 20 ms
    assert row["sync_source"] == "comm_bench"
    assert row["sync_s"] == pytest.approx(94 * 0.004 * 0.5)
    assert row["predicted_s"] == pytest.approx(2.94 + 0.2 + 0.188)
    assert row["predicted_speedup"] == pytest.approx(6.0 / 3.328) and row["measured_speedup"] == pytest.approx(1.5)
    assert row["loss_data_s"] == pytest.approx(0.2 - 0.12 / 2)
    assert row["loss_sync_s"] == pytest.approx(94 * 0.010)  # 0.94 s exposed: more than the model's 0.188 s
    assert row["loss_compute_s"] == pytest.approx(94 * 0.035 - 2.94)  # 0.35 s
    assert row["loss_other_s"] == pytest.approx(4.0 - 3.0 - 0.14 - 0.94 - 0.35)
    assert row["largest"] == scaling.LOSSES["loss_sync_s"]


def test_without_comm_bench_the_probe_times_the_all_reduce(tables):
    row = scaling.model(tables["cells"], tables["epochs"], None).iloc[0]
    assert row["sync_source"] == "probe" and row["sync_s"] == pytest.approx(94 * 0.020 * 0.5)
    assert row["predicted_speedup"] == pytest.approx(6.0 / (2.94 + 0.2 + 0.94))


def test_without_a_probe_the_all_reduce_is_unknown_and_the_rest_holds_it(tmp_path):
    """Records made before the probe existed: no gradient size, so no all-reduce term."""
    records = [
        make_record(mode="single", samples_per_s=1000.0, wait_frac=0.02),
        make_record(mode="ddp", gpus=2, backend="gloo", samples_per_s=1500.0, wait_frac=0.05),
    ]
    tables = collect.collect(write_records(tmp_path, records), CURRENT)
    row = scaling.model(tables["cells"], tables["epochs"], COMM).iloc[0]
    assert row["sync_source"] == "none" and math.isnan(row["loss_sync_s"]) and math.isnan(row["overlap"])
    assert row["loss_other_s"] == pytest.approx(4.0 - 3.0 - 0.14) and row["largest"].startswith("everything else")


def test_cells_without_a_finished_baseline_are_left_out(tmp_path):
    records = [
        make_record("skipped", mode="single", reason="x"),
        make_record(mode="ddp", gpus=2, backend="gloo", probe=PROBE),
    ]
    tables = collect.collect(write_records(tmp_path, records), CURRENT)
    assert scaling.model(tables["cells"], tables["epochs"], COMM).empty


def test_repeats_fold_into_medians(tmp_path):
    records = [make_record(mode="single", samples_per_s=1000.0, repeat=s, suffix=f"-r{s}") for s in range(3)]
    records += [
        make_record(mode="ddp", gpus=2, backend="gloo", samples_per_s=tput, probe=PROBE, repeat=s, suffix=f"-r{s}")
        for s, tput in enumerate((1400.0, 1500.0, 1900.0))
    ]
    tables = collect.collect(write_records(tmp_path, records), CURRENT)
    settings = stats.settings_table(tables["cells"])
    per_setting = scaling.by_setting(scaling.model(tables["cells"], tables["epochs"], COMM), settings)
    # THE speedup of the setting (ratio of geometric means, 1574 / 1000), not the median ratio 1.5
    expected = stats.ratio([1400.0, 1500.0, 1900.0], [1000.0] * 3)
    assert per_setting["measured_speedup"].tolist() == pytest.approx([expected[0]])
    assert per_setting["measured_speedup_low"].tolist() == pytest.approx([expected[1]])
    assert expected[0] == pytest.approx((1400 * 1500 * 1900) ** (1 / 3) / 1000)


def test_the_model_per_setting_is_a_table_with_fixed_columns(tmp_path):
    """scaling_settings: by_setting with the setting's number and its largest loss in seconds."""
    records = [make_record(mode="single", samples_per_s=1000.0, repeat=s, suffix=f"-r{s}") for s in range(2)]
    records += [
        make_record(mode="ddp", gpus=2, backend="gloo", samples_per_s=tput, probe=PROBE, repeat=s, suffix=f"-r{s}")
        for s, tput in enumerate((1400.0, 1600.0))
    ]
    tables = collect.collect(write_records(tmp_path, records), CURRENT)
    settings = stats.settings_table(tables["cells"])
    model = scaling.model(tables["cells"], tables["epochs"], COMM)
    table = scaling.settings_model(model, settings)
    assert list(table.columns) == list(scaling.SETTING_MODEL_COLUMNS) and len(table) == 1
    row = table.iloc[0]
    assert row["setting"] == settings.loc[settings["mode"] == "ddp", "setting"].item()
    assert row["largest_s"] == pytest.approx(max(row[k] for k in scaling.LOSSES if pd.notna(row[k])))
    assert row["largest_s"] == pytest.approx(row[next(k for k, v in scaling.LOSSES.items() if v == row["largest"])])
    empty = scaling.settings_model(model.iloc[:0], settings)
    assert empty.empty and list(empty.columns) == list(scaling.SETTING_MODEL_COLUMNS)


FSDP_PROBE = {
    "steps": 8,
    "sync_step_s": 0.050,
    "nosync_step_s": 0.035,  # the step on an unsharded replica: 15 ms exposed
    "allgather_s": 0.006,  # one all-gather of every unit
    "reduce_scatter_s": 0.008,
    "gather_bytes": 200_000,
    "grad_bytes": 400_000,
    "units": 4,
}
# gloo on CPU, 2 processes, at every size: all-gather 0.05 GB/s, reduce-scatter 0.1 GB/s bus bandwidth
COLLECTIVES = pd.DataFrame(
    {
        "collective": ["all_gather"] * 2 + ["reduce_scatter"] * 2,
        "backend": "gloo",
        "device": "cpu",
        "world_size": 2,
        "bytes": [4096, 4 << 20] * 2,
        "busbw_gbps": [0.05, 0.05, 0.1, 0.1],
        "reason": None,
    }
)


@pytest.mark.parametrize(
    "shard, t_sync, overlap",
    [
        # full: two all-gathers of 2e5 B x (2-1)/2 at 5e7 B/s (2 ms each) + a reduce-scatter of 4e5 B x 1/2
        # at 1e8 B/s (2 ms); the probe's collectives: 2 x 6 + 8 = 20 ms, of which 15 ms exposed
        ("full", 0.006, 0.25),
        # grad_op: one all-gather: 4 ms; the probe's 6 + 8 = 14 ms, all exposed (15 ms: overlap clipped to 0)
        ("grad_op", 0.004, 0.0),
    ],
)
def test_fsdp_terms_are_its_all_gathers_and_reduce_scatter(tmp_path, shard, t_sync, overlap):
    records = [
        make_record(mode="single", samples_per_s=1000.0, wait_frac=0.02),
        make_record(
            mode="fsdp", shard=shard, gpus=2, backend="gloo", samples_per_s=1500.0, wait_frac=0.05, probe=FSDP_PROBE
        ),
    ]
    tables = collect.collect(write_records(tmp_path, records), CURRENT)
    row = scaling.model(tables["cells"], tables["epochs"], COLLECTIVES).iloc[0]
    assert row["mode"] == "fsdp" and row["shard"] == shard and row["steps"] == 94
    assert row["sync_source"] == "comm_bench" and row["overlap"] == pytest.approx(overlap)
    assert row["sync_s"] == pytest.approx(94 * t_sync * (1 - overlap))
    assert row["predicted_s"] == pytest.approx(2.94 + 0.2 + 94 * t_sync * (1 - overlap))
    assert row["loss_sync_s"] == pytest.approx(94 * 0.015)
    assert row["loss_compute_s"] == pytest.approx(94 * 0.035 - 2.94)
    # without comm_bench's collectives, the probe's own: 20 ms (full) or 14 ms (grad_op) per step
    row = scaling.model(tables["cells"], tables["epochs"], COMM).iloc[0]
    probed = 0.020 if shard == "full" else 0.014
    assert row["sync_source"] == "probe" and row["sync_s"] == pytest.approx(94 * probed * (1 - overlap))


def test_steps_that_compiled_leave_the_epoch_the_model_explains(tmp_path):
    """compile: true: the steps that compiled a graph sit inside the epoch's wall and compute
    seconds; the model takes them out, as the throughput's steady window does, so that a 3 s
    compile is not read as a loss against n x."""

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
    row = scaling.model(tables["cells"], tables["epochs"], COMM).iloc[0]
    # the same parts as without compiling (test_the_parts_and_the_prediction)
    assert row["measured_s"] == pytest.approx(4.0) and row["ideal_s"] == pytest.approx(3.0)
    assert row["compute_s"] == pytest.approx(2.94)
    assert row["loss_other_s"] == pytest.approx(4.0 - 3.0 - 0.14 - 0.94 - 0.35)
