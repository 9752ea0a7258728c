"""memory_split and memory_accuracy (dpstudy.analysis.memory): measured beside predicted per device."""

import math

import pandas as pd
import pytest

from dpstudy.analysis import memory


def rec(cell, peaks):
    parts = {p: [1.0] * len(peaks) for p in ("params_mb", "grads_mb", "optimizer_mb")}
    return ("path", {"cell": cell, "memory": {**parts, "activations_mb": [p - 3 for p in peaks], "peak_mb": peaks}})


CELLS = pd.DataFrame({"cell": ["ddp", "single", "skipped"], "mode": ["ddp", "single", "fsdp"]})
PLAN = pd.DataFrame(
    [
        {"cell": "ddp", "device": 0, "peak_mb": 11.0},
        {"cell": "ddp", "device": 1, "peak_mb": 11.0},
        {"cell": "single", "device": None, "reason": "not predicted: RuntimeError: x"},
        {"cell": "skipped", "device": 0, "peak_mb": 5000.0},
        {"cell": "elsewhere", "device": 0, "peak_mb": 1.0},  # a cell of another study: left out
    ]
)


def test_each_device_has_its_measured_split_beside_the_prediction():
    records = [rec("ddp", [10.0, 12.5]), rec("single", [20.0]), ("path", {"cell": "skipped", "memory": None})]
    split = memory.split_table(memory.measured_rows(records), PLAN, CELLS)
    assert split["cell"].tolist() == ["ddp", "ddp", "single", "skipped"]
    ddp = split[split["cell"] == "ddp"]
    assert ddp["error_pct"].tolist() == pytest.approx([10.0, -12.0])
    assert ddp["activations_mb"].tolist() == [7.0, 9.5]
    single = split[split["cell"] == "single"].iloc[0]
    assert single["peak_mb"] == 20 and math.isnan(single["predicted_peak_mb"])
    assert single["plan_reason"] == "not predicted: RuntimeError: x"
    skipped = split[split["cell"] == "skipped"].iloc[0]  # predicted only, as a cell the budget skipped
    assert skipped["predicted_peak_mb"] == 5000 and math.isnan(skipped["peak_mb"]) and skipped["mode"] == "fsdp"

    accuracy = memory.accuracy_table(split).set_index("mode")
    assert accuracy.loc["ddp", "devices"] == 2 and accuracy.loc["all", "devices"] == 2
    assert accuracy.loc["ddp", "median_abs_error_pct"] == pytest.approx(11.0)
    assert accuracy.loc["ddp", "max_abs_error_pct"] == pytest.approx(12.0)
    assert bool(accuracy.loc["ddp", "within_target"])
    assert "single" not in accuracy.index  # nothing predicted to compare with


def test_a_prediction_off_by_more_than_the_target_is_flagged_and_no_plan_gives_measured_only():
    split = memory.split_table(memory.measured_rows([rec("ddp", [10.0, 8.0])]), PLAN, CELLS)
    accuracy = memory.accuracy_table(split).set_index("mode")
    assert accuracy.loc["ddp", "max_abs_error_pct"] == pytest.approx(37.5)
    assert not accuracy.loc["all", "within_target"]
    alone = memory.split_table(memory.measured_rows([rec("single", [20.0])]), None, CELLS)
    assert alone["peak_mb"].tolist() == [20.0] and alone["predicted_peak_mb"].isna().all()
    assert memory.accuracy_table(alone).empty


def test_a_cuda_cell_is_checked_against_the_allocator_and_a_cpu_cell_against_the_tracker():
    cuda = rec("ddp", [10.0, 12.5])
    # the allocator held more than the tracked tensors: the resident data, the buckets, workspaces
    cuda[1]["memory"] |= {
        "allocated_mb": [40.0, 50.0],
        "reserved_mb": [64.0, 64.0],
        "context_mb": [500.0, None],
        "total_mb": [81559.0, 81559.0],
        "resident_mb": [20.0, 20.0],
    }
    plan = PLAN.assign(allocated_mb=[44.0, 45.0, None, 5000.0, 1.0])
    cells = pd.concat([CELLS, pd.DataFrame({"cell": ["cpu"], "mode": ["single"]})])
    plan = pd.concat([plan, pd.DataFrame([{"cell": "cpu", "device": 0, "peak_mb": 22.0, "allocated_mb": 30.0}])])
    cpu = rec("cpu", [20.0])
    cpu[1]["memory"]["rss_growth_mb"] = [6.5]  # the process's resident memory over the step
    split = memory.split_table(memory.measured_rows([cuda, cpu]), plan, cells)
    ddp = split[split["cell"] == "ddp"]
    assert ddp["against"].tolist() == ["allocator"] * 2
    assert ddp["error_pct"].tolist() == pytest.approx([10.0, -10.0])  # 44 vs 40, 45 vs 50
    assert ddp["context_mb"].iloc[0] == 500 and math.isnan(ddp["context_mb"].iloc[1])
    cpu = split[split["cell"] == "cpu"].iloc[0]  # no allocator: the tracker's 22 predicted vs its 20
    assert cpu["against"] == "tracker" and cpu["error_pct"] == pytest.approx(10.0)
    accuracy = memory.accuracy_table(split).set_index(["against", "mode"])
    assert accuracy.loc[("allocator", "all"), "devices"] == 2
    assert accuracy.loc[("tracker", "single"), "median_abs_error_pct"] == pytest.approx(10.0)
    assert accuracy.loc[("tracker", "single"), "rss_growth_mb"] == 6.5
    assert accuracy.loc[("tracker", "single"), "activations_mb"] == 17.0  # rec(): the peak less 3 MB of state
    assert math.isnan(accuracy.loc[("allocator", "all"), "rss_growth_mb"])
    assert ("tracker", "ddp") not in accuracy.index
