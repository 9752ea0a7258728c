"""The numbers the report states, as table columns: comparisons between settings, the study's summary,
data wait, memory and utilisation, the overview's pivots and the model per setting, each asserted as a
number on records whose throughputs, accuracies and waits are known exactly (tests/helpers/records.py)."""

from __future__ import annotations

import math
import statistics

import pandas as pd
import pytest
from helpers.records import CURRENT, SAMPLES, cells_frame, ddp_pair, make_record, make_util, write_records

from dpstudy.analysis import collect, comparisons, pivots, scaling, stats, summary, tablefiles
from dpstudy.study import outputs


def tables_of(tmp_path, records: list[dict]) -> dict[str, pd.DataFrame]:
    return collect.summarise(collect.collect(write_records(tmp_path, records), CURRENT))


def repeated(mode: str, values: list[float], accs: list[float] | None = None, **keys) -> list[dict]:
    accs = accs or [0.9] * len(values)
    return [
        make_record(mode=mode, samples_per_s=v, accs=(0.6, a), repeat=i, suffix=f"-r{i}", **keys)
        for i, (v, a) in enumerate(zip(values, accs))
    ]


def loaded(record: dict, other_load: float) -> dict:
    """`record` with other processes using `other_load` cores in every epoch."""
    for epoch in record["epochs"]:
        epoch["other_load"] = other_load
    return record


def setting(tables, **keys) -> pd.Series:
    rows = tables["settings"]
    for k, v in keys.items():
        rows = rows[rows[k] == v]
    assert len(rows) == 1, keys
    return rows.iloc[0]


def of_kind(tables, kind: str) -> pd.DataFrame:
    table = tables["comparisons"]
    return table[table["kind"] == kind].reset_index(drop=True)


# ---- the settings table: a number per setting, the verdict its interval gives ------------------


def test_settings_are_numbered_and_carry_their_verdict(tmp_path):
    tables = tables_of(
        tmp_path,
        [
            *repeated("single", [1000.0, 1100.0, 950.0]),
            *repeated("ddp", [1500.0, 1600.0, 1400.0], gpus=2, backend="gloo"),
            *repeated("single", [1000.0, 1050.0, 1020.0], batch=128),
            *repeated("ddp", [900.0, 1200.0, 1000.0], gpus=2, backend="gloo", batch=128),
            *repeated("single", [1000.0, 1010.0, 990.0], batch=256),
            *repeated("ddp", [600.0, 610.0, 590.0], gpus=2, backend="gloo", batch=256),
        ],
    )
    settings = tables["settings"]
    assert settings["setting"].tolist() == list(range(6))
    faster, noisier = setting(tables, mode="ddp", batch=64), setting(tables, mode="ddp", batch=128)
    slower = setting(tables, mode="ddp", batch=256)
    assert (faster["verdict"], noisier["verdict"], slower["verdict"]) == ("faster", "noisier", "slower")
    # the noise of the noisier setting: its own 15 % CV, larger than its baseline's 2.4 %
    assert noisier["noise_max_cv"] == pytest.approx(stats.cv([900.0, 1200.0, 1000.0]))
    assert noisier["noise_max_cv"] > stats.cv([1000.0, 1050.0, 1020.0])
    assert noisier["effect"] == pytest.approx(abs(noisier["speedup"] - 1))
    assert slower["effect"] == pytest.approx(0.4, abs=0.01)
    assert settings.loc[settings["mode"] == "single", "verdict"].isna().all()  # its own baseline


def test_one_run_has_no_verdict_and_no_noise(tmp_path):
    tables = tables_of(tmp_path, [make_record(mode="single"), make_record(mode="ddp", gpus=2, backend="gloo")])
    ddp = setting(tables, mode="ddp")
    assert pd.isna(ddp["verdict"]) and math.isnan(ddp["noise_max_cv"]) and not ddp["noisy"]


def test_within_noise_when_the_interval_holds_one(tmp_path):
    # 1.10x with 5 % noise on either side: the interval holds 1, the noise is smaller than the effect
    tables = tables_of(
        tmp_path,
        [
            *repeated("single", [1000.0, 1050.0, 950.0]),
            *repeated("ddp", [1100.0, 1155.0, 1045.0], gpus=2, backend="gloo"),
        ],
    )
    ddp = setting(tables, mode="ddp")
    assert ddp["speedup_low"] < 1 < ddp["speedup_high"] and not ddp["noisy"]
    assert ddp["verdict"] == "within noise" and ddp["effect"] == pytest.approx(0.1)


# ---- comparisons between settings --------------------------------------------------------------


def test_across_nodes_is_the_throughput_ratio_with_its_interval(tmp_path):
    tables = tables_of(
        tmp_path,
        [
            *repeated("single", [1000.0, 1010.0, 990.0]),
            *repeated("ddp", [1800.0, 1700.0, 1900.0], gpus=2, backend="gloo"),
            *repeated("ddp", [1200.0, 1300.0, 1100.0], gpus=1, nodes=2, backend="gloo"),
        ],
    )
    nodes = of_kind(tables, "nodes")
    assert len(nodes) == 1
    far, near = setting(tables, gpus=1, nodes=2), setting(tables, gpus=2, nodes=1)
    pair = nodes.iloc[0]
    assert (pair["setting"], pair["other"]) == (far["setting"], near["setting"])
    expected = stats.ratio([1200.0, 1300.0, 1100.0], [1800.0, 1700.0, 1900.0])
    assert (pair["value"], pair["low"], pair["high"]) == pytest.approx(expected)
    assert pair["value"] == pytest.approx(far["samples_per_s"] / near["samples_per_s"])
    assert pair["claim"] == -1 and pair["repeats"] == 3  # 1,200 [1,000-1,440] below 1,800 [1,580-2,050]


def test_one_run_each_across_nodes_has_no_interval(tmp_path):
    tables = tables_of(
        tmp_path,
        [
            make_record(mode="single", samples_per_s=1000.0),
            make_record(mode="ddp", gpus=2, backend="gloo", samples_per_s=1800.0),
            make_record(mode="ddp", gpus=1, nodes=2, backend="gloo", samples_per_s=1200.0),
        ],
    )
    pair = of_kind(tables, "nodes").iloc[0]
    assert pair["value"] == pytest.approx(1200 / 1800) and math.isnan(pair["low"]) and math.isnan(pair["high"])
    assert pair["claim"] == 0 and pair["repeats"] == 1


def test_accuracy_gap_per_group_and_the_largest(tmp_path):
    tables = tables_of(
        tmp_path,
        [
            *repeated("single", [1000.0] * 3, [0.90, 0.91, 0.905]),
            *repeated("ddp", [1500.0] * 3, [0.80, 0.81, 0.79], gpus=2, backend="gloo"),
            *repeated("single", [1000.0] * 3, [0.88, 0.89, 0.87], batch=128),
            *repeated("ddp", [1500.0] * 3, [0.87, 0.88, 0.875], gpus=2, backend="gloo", batch=128),
            make_record(mode="single", batch=256, accs=(0.6, 0.7)),  # alone in its group: no comparison
        ],
    )
    gaps = of_kind(tables, "accuracy")
    assert len(gaps) == 2
    b64, b128 = gaps.iloc[0], gaps.iloc[1]
    single64, ddp64 = setting(tables, mode="single", batch=64), setting(tables, mode="ddp", batch=64)
    assert (b64["setting"], b64["other"]) == (single64["setting"], ddp64["setting"])
    assert b64["value"] == pytest.approx(0.905 - 0.80)
    expected = stats.difference([0.90, 0.91, 0.905], [0.80, 0.81, 0.79])
    assert (b64["low"], b64["high"]) == pytest.approx(expected[1:])
    assert b64["claim"] == 1 and b64["largest"]  # 90.5 % [89.3-91.7] above 80.0 % [77.5-82.5]
    assert b128["value"] == pytest.approx(0.88 - 0.875)
    assert b128["claim"] == 0 and not b128["largest"] and b128["repeats"] == 3
    assert b64["members"] == f"{ddp64['setting']} {single64['setting']}"  # every setting of the group, table order


def test_equal_accuracies_never_compare_a_setting_with_itself(tmp_path):
    tables = tables_of(
        tmp_path,
        [make_record(mode="single"), make_record(mode="ddp", gpus=2, backend="gloo"), make_record(mode="dp", gpus=2)],
    )
    gap = of_kind(tables, "accuracy").iloc[0]
    assert gap["value"] == 0 and gap["setting"] != gap["other"]
    assert len(gap["members"].split()) == 3 and gap["claim"] == 0 and gap["repeats"] == 1


def test_nccl_against_gloo(tmp_path):
    tables = tables_of(
        tmp_path,
        [
            *repeated("ddp", [1700.0, 1750.0, 1690.0], gpus=2, backend="nccl", device="cuda"),
            *repeated("ddp", [1300.0, 1250.0, 1320.0], gpus=2, backend="gloo", device="cuda"),
            *repeated("ddp", [1300.0, 1250.0, 1320.0], gpus=2, backend="nccl", device="cuda", batch=128),
            *repeated("ddp", [1300.0, 1350.0, 1220.0], gpus=2, backend="gloo", device="cuda", batch=128),
        ],
    )
    pairs = of_kind(tables, "backend")
    assert len(pairs) == 2
    b64, b128 = pairs.iloc[0], pairs.iloc[1]
    assert b64["setting"] == setting(tables, backend="nccl", batch=64)["setting"]
    assert b64["other"] == setting(tables, backend="gloo", batch=64)["setting"]
    expected = stats.ratio([1700.0, 1750.0, 1690.0], [1300.0, 1250.0, 1320.0])
    assert (b64["value"], b64["low"], b64["high"]) == pytest.approx(expected)
    assert b64["claim"] == 1 and b128["claim"] == 0 and b64["largest"] and not b128["largest"]
    assert b128["value"] == pytest.approx(stats.ratio([1300.0, 1250.0, 1320.0], [1300.0, 1350.0, 1220.0])[0])


def test_comparisons_of_a_hand_made_settings_table():
    """comparisons_table on hand-made cells: no records, no collect."""
    cells = cells_frame([("single", 1, 1000.0), ("single", 1, 1100.0), ("ddp", 2, 1800.0), ("ddp", 2, 2000.0)])
    cells["final_test_acc"] = [0.90, 0.92, 0.85, 0.87]
    settings = stats.settings_table(cells)
    table = comparisons.comparisons_table(settings, cells)
    assert list(table.columns) == list(comparisons.COLUMNS)
    gap = table.iloc[0]
    assert gap["kind"] == "accuracy" and gap["value"] == pytest.approx(0.91 - 0.86)
    assert (gap["low"], gap["high"]) == pytest.approx(stats.difference([0.90, 0.92], [0.85, 0.87])[1:])
    assert comparisons.comparisons_table(settings.iloc[:0], cells).empty


# ---- the study's summary -----------------------------------------------------------------------


def test_summary_counts_verdicts_and_the_noise_floor(tmp_path):
    tables = tables_of(
        tmp_path,
        [
            *repeated("single", [1000.0, 1100.0, 950.0]),
            *repeated("ddp", [1500.0, 1600.0, 1400.0], gpus=2, backend="gloo"),
            *repeated("single", [1000.0, 1050.0, 1020.0], batch=128),
            *repeated("ddp", [900.0, 1200.0, 1000.0], gpus=2, backend="gloo", batch=128),
            *repeated("single", [1000.0, 1001.0, 999.0], batch=256),
            make_record(mode="ddp", gpus=2, backend="gloo", batch=256, samples_per_s=2000.0),
        ],
    )
    row = tables["summary"].iloc[0]
    assert list(tables["summary"].columns) == list(summary.SUMMARY_COLUMNS) and len(tables["summary"]) == 1
    assert row["multi_settings"] == 3
    assert (row["faster"], row["slower"], row["within_noise"], row["noisier"]) == (1, 0, 0, 1)  # one run: none
    cvs = [stats.cv([1000.0, 1100.0, 950.0]), stats.cv([1000.0, 1050.0, 1020.0]), stats.cv([1000.0, 1001.0, 999.0])]
    assert row["noise_floor_settings"] == 3
    assert row["noise_floor_median_cv"] == pytest.approx(statistics.median(cvs))
    assert row["noise_floor_max_cv"] == pytest.approx(max(cvs))


def test_summary_counts_the_runs_that_shared_the_machine(tmp_path):
    tables = tables_of(
        tmp_path,
        [loaded(make_record(mode="single", repeat=i, suffix=f"-r{i}"), load) for i, load in enumerate((0.1, 0.5, 1.3))]
        + [make_record("skipped", mode="dp", gpus=2, reason="x")],
    )
    row = tables["summary"].iloc[0]
    assert (row["finished_cells"], row["busy_cells"], row["busy_cores"]) == (3, 2, summary.BUSY_CORES)
    assert row["other_load_max"] == pytest.approx(1.3) and row["busy_other_load_max"] == pytest.approx(1.3)
    quiet = tables_of(tmp_path / "quiet", [loaded(make_record(mode="single"), 0.2)])["summary"].iloc[0]
    assert quiet["busy_cells"] == 0 and quiet["other_load_max"] == pytest.approx(0.2)
    assert math.isnan(quiet["busy_other_load_max"])


def test_summary_of_a_study_without_finished_cells(tmp_path):
    tables = tables_of(tmp_path, [make_record("skipped", mode="dp", gpus=2, reason="x")])
    row = tables["summary"].iloc[0]
    assert row["multi_settings"] == row["faster"] == row["finished_cells"] == row["busy_cells"] == 0
    assert math.isnan(row["noise_floor_median_cv"]) and math.isnan(row["other_load_max"])


# ---- waiting for data, memory, utilisation ------------------------------------------------------


def test_data_wait_shares_by_loader_and_by_setup(tmp_path):
    tables = tables_of(
        tmp_path,
        [
            make_record(mode="single", loader="torch", workers=0, wait_frac=0.12),
            make_record(mode="ddp", gpus=2, backend="gloo", loader="device", wait_frac=0.01, samples_per_s=1500.0),
            make_record(
                mode="ddp", gpus=2, backend="gloo", loader="device", wait_frac=0.04, samples_per_s=1500.0, batch=128
            ),
        ],
    )
    wait = tables["data_wait"]
    loaders, setups = wait[wait["by"] == "loader"], wait[wait["by"] == "setup"]
    # the largest share first: torch 12 %; device: (0.01 + 0.04) x 4 s / (2 x 4 s) = 2.5 %
    assert loaders["loader"].tolist() == ["torch", "device"] and loaders["workers"].tolist() == [0, 0]
    assert loaders["share"].tolist() == pytest.approx([0.12, 0.025])
    assert loaders["wall_s"].tolist() == pytest.approx([SAMPLES / 1000.0, 2 * SAMPLES / 1500.0])
    assert loaders["augment"].isna().all()  # augment does not vary
    assert setups["mode"].tolist() == ["ddp", "single"] and setups["gpus"].tolist() == [2, 1]
    assert setups["share"].tolist() == pytest.approx([0.025, 0.12])
    assert (wait["share"] == wait["data_wait_s"] / wait["wall_s"]).all()


def test_data_wait_names_augment_when_it_varies_and_is_empty_without_steady_epochs(tmp_path):
    tables = tables_of(
        tmp_path,
        [
            make_record(mode="single", loader="torch", workers=2, wait_frac=0.12, augment="flip", suffix="-f"),
            make_record(mode="single", loader="torch", workers=2, wait_frac=0.2, augment="none"),
        ],
    )
    loaders = tables["data_wait"].query("by == 'loader'")
    assert loaders["augment"].tolist() == ["none", "flip"] and loaders["share"].tolist() == pytest.approx([0.2, 0.12])
    none = tables_of(tmp_path / "none", [make_record("skipped", mode="dp", gpus=2, reason="x")])["data_wait"]
    assert none.empty and list(none.columns) == list(summary.WAIT_COLUMNS)


def test_memory_imbalance_per_cell_and_the_largest_per_mode(tmp_path):
    tables = tables_of(
        tmp_path,
        [
            make_record(mode="dp", gpus=2, device="cuda", peak_mem=[300.0, 180.0]),
            make_record(mode="dp", gpus=2, batch=128, device="cuda", peak_mem=[400.0, 180.0]),
            make_record(mode="ddp", gpus=2, backend="nccl", device="cuda", peak_mem=[120.0, 119.0]),
            make_record(mode="single"),
        ],
    )
    memory = tables["memory"].set_index("cell")
    assert len(memory) == 3  # multi-device cells only
    assert memory.loc["synthetic-lenet-dp-g2-b64-none", "imbalance"] == pytest.approx(300 / 180)
    assert memory.loc["synthetic-lenet-dp-g2-b128-none", "imbalance"] == pytest.approx(400 / 180)
    assert memory.loc["synthetic-lenet-ddp-g2-b64-nccl", "imbalance"] == pytest.approx(120 / 119)
    assert memory.index[memory["largest"]].tolist() == [
        "synthetic-lenet-ddp-g2-b64-nccl",
        "synthetic-lenet-dp-g2-b128-none",
    ]


def test_utilisation_means_per_cell_and_gpu(tmp_path):
    tables = tables_of(
        tmp_path, [make_record(mode="ddp", gpus=2, backend="nccl", device="cuda", util=make_util(2, [60.0, 58.0]))]
    )
    means = tables["util_means"]
    assert means["device"].tolist() == [0, 1] and means["gpu_util"].tolist() == pytest.approx([60.0, 58.0])
    assert means["samples"].tolist() == [6, 6]


# ---- the overview's pivots and the model per setting -------------------------------------------


def test_pivot_medians_and_varied_keys(tmp_path):
    records = []
    for batch in (64, 128):
        for lr in (0.01, 0.1, 0.3):
            records.append(
                make_record(
                    mode="single",
                    batch=batch,
                    lr=lr,
                    samples_per_s=1000.0,
                    suffix=f"-lr{lr}",
                    accs=(0.5, 0.9 - lr / 10),
                )
            )
            records.append(
                make_record(
                    mode="ddp",
                    gpus=2,
                    backend="gloo",
                    batch=batch,
                    lr=lr,
                    suffix=f"-lr{lr}",
                    samples_per_s=1000.0 * (1.2 + lr),
                    accs=(0.5, 0.8),
                )
            )
    tables = tables_of(tmp_path, records)
    varied = tables["varied"].set_index("key")["values"]
    assert varied.to_dict() == {
        "mode": 2,
        "gpus": 2,
        "batch": 2,
        "backend": 2,
        "lr": 3,
        "devices": 2,
        "global_batch": 2,
    }
    pivot = tables["pivot"]
    # lr has the most values (3), then mode comes first in SETTING_KEYS of the keys with 2
    assert set(pivot["row_key"]) == {"lr"} and set(pivot["column_key"]) == {"mode"}
    speedups = pivot[pivot["of"] == "multi"].set_index(["row", "column"])
    assert speedups.loc[(0.1, "ddp"), "speedup"] == pytest.approx(1.3)
    assert speedups.loc[(0.1, "ddp"), "efficiency"] == pytest.approx(0.65)
    assert speedups.loc[(0.1, "ddp"), "settings"] == 2  # two batches folded into the median
    accuracies = pivot[pivot["of"] == "all"].set_index(["row", "column"])
    assert accuracies.loc[(0.3, "single"), "final_test_acc"] == pytest.approx(0.87)
    assert len(accuracies) == 6 and len(speedups) == 3
    assert pivots.axis_keys(tables["settings"]) == ["lr", "mode"]


def test_model_per_setting_names_the_largest_loss_in_seconds(tmp_path):
    tables = tables_of(tmp_path, ddp_pair())
    row = tables["scaling_settings"].iloc[0]
    assert row["setting"] == setting(tables, mode="ddp")["setting"]
    assert row["largest"] == scaling.LOSSES["loss_exposed_s"]
    assert row["largest_s"] == pytest.approx(0.010)  # see test_scaling: 10 ms exposed per step
    assert row["measured_speedup"] == pytest.approx(1.5) and row["ideal_s"] == pytest.approx(0.032)


# ---- written and read back like the other tables ----------------------------------------------


def test_every_table_is_written_and_read_back_even_when_empty(tmp_path):
    assert outputs.TABLES[:7] == ("cells", "epochs", "ranks", "util", "memory_split", "settings", "scaling")
    for name, records in (
        ("some", [make_record(mode="single"), make_record(mode="ddp", gpus=2, backend="gloo")]),
        ("none", [make_record("skipped", mode="dp", gpus=2, reason="x")]),
    ):
        tables = tables_of(tmp_path / name, records)
        assert set(tables) == set(outputs.TABLES)
        tablefiles.write_tables(tables, tmp_path / name / "tables")
        back = tablefiles.read_tables(tmp_path / name / "tables")
        for table in outputs.TABLES:
            assert list(back[table].columns) == list(tables[table].columns), table
            assert len(back[table]) == len(tables[table]), table
    assert back["summary"].iloc[0]["busy_cores"] == summary.BUSY_CORES
