"""Tokens/s, achieved FLOP/s and MFU from a cell's throughput and cost: the right peak or none."""

import math

import pandas as pd
import pytest

from dpstudy.analysis import utilisation


def cells(**overrides) -> pd.DataFrame:
    base = {
        "cell": "c0",
        "status": "ok",
        "samples_per_s": 100.0,
        "devices": 2,
        "env_device": "cuda",
        "gpu_names": "NVIDIA H100 80GB HBM3; NVIDIA H100 80GB HBM3",
        "precision": "bf16",
        "task": "text",
        "tokens_per_sample": 1024,
        "flops_per_sample": 6e11,
        "hardware_flops_per_sample": math.nan,
        "flops_reason": None,
        "final_test_loss": 2.0,
    }
    return pd.DataFrame([{**base, **overrides}])


FLOOR = pd.DataFrame({"device": ["cpu", "cpu", "cpu"], "threads": [1, 2, 1], "compute_gflops": [90.0, 200.0, 120.0]})


def test_gpu_mfu_divides_by_every_device_s_datasheet_peak():
    row = utilisation.with_utilisation(cells(), FLOOR).iloc[0]
    assert row["tokens_per_s"] == 102_400 and row["tokens_per_s_per_device"] == 51_200
    assert row["model_tflops"] == pytest.approx(60.0)
    assert row["peak_tflops"] == pytest.approx(2 * 989.5)
    assert row["mfu"] == pytest.approx(60.0 / 1979.0)
    assert "H100 SXM datasheet" in row["peak_source"] and row["mfu_reason"] is None
    assert row["perplexity"] == pytest.approx(math.exp(2.0))


def test_fp32_uses_the_cuda_cores_peak_and_hfu_counts_the_recompute():
    row = utilisation.with_utilisation(cells(precision="fp32", hardware_flops_per_sample=8e11), FLOOR).iloc[0]
    assert row["peak_tflops"] == pytest.approx(2 * 67.0)
    assert row["hfu"] == pytest.approx(80.0 / 134.0) and row["hfu"] > row["mfu"]


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"gpu_names": "AMD Instinct MI350X"}, "AMD Instinct MI350X is not in the peak table"),
        ({"gpu_names": "NVIDIA B200", "precision": "fp32"}, "gives no dense fp32 peak"),
        ({"flops_per_sample": math.nan, "flops_reason": "not counted: X"}, "not counted: X"),
    ],
)
def test_no_mfu_without_the_device_s_own_peak_and_the_reason_says_why(overrides, reason):
    row = utilisation.with_utilisation(cells(**overrides), FLOOR).iloc[0]
    assert math.isnan(row["mfu"]) and reason in row["mfu_reason"]


def test_cpu_mfu_is_of_the_floor_s_measured_matmul_rate_per_core_times_the_cell_s_cores():
    cpu = {"env_device": "cpu", "gpu_names": None, "devices": 2, "world_size": 2, "threads_per_process": 1}
    cpu["precision"] = "fp32"
    row = utilisation.with_utilisation(cells(**cpu), FLOOR).iloc[0]
    assert row["peak_tflops"] == pytest.approx(2 * 0.1)  # the median floor run: 100 GFLOP/s per core
    assert row["mfu"] == pytest.approx(60.0 / 0.2)  # this fake cell claims more than the machine
    assert row["peak_source"].startswith("the measured peak") and row["peak_source"].endswith("x 2 cores")
    # four ranks pinned to the two cores a job had: the machine is two cores, not four
    env = {"ranks": [{"node": "vm", "cores": [0]}, {"node": "vm", "cores": [1]}, {"node": "vm", "cores": []}]}
    assert utilisation.cores_used(env) == 2 and utilisation.cores_used({"ranks": [{"cores": []}]}) is None
    shared = utilisation.with_utilisation(cells(**{**cpu, "world_size": 4, "devices": 4, "cores": 2}), FLOOR).iloc[0]
    assert shared["peak_tflops"] == pytest.approx(0.2) and shared["peak_source"].endswith("x 2 cores")
    bf16 = utilisation.with_utilisation(cells(**{**cpu, "precision": "bf16"}), FLOOR).iloc[0]
    assert math.isnan(bf16["mfu"]) and "fp32 matmul rate, and this cell ran bf16" in bf16["mfu_reason"]
    no_floor = utilisation.with_utilisation(cells(**cpu), None).iloc[0]
    assert math.isnan(no_floor["mfu"]) and "floor" in no_floor["mfu_reason"]


def test_images_have_no_tokens_but_do_have_mfu():
    row = utilisation.with_utilisation(cells(task="image", tokens_per_sample=None, flops_per_sample=3.6e9), FLOOR).iloc[
        0
    ]
    assert math.isnan(row["tokens_per_s"]) and math.isnan(row["perplexity"])
    assert row["mfu"] == pytest.approx(100 * 3.6e9 / 1e12 / 1979.0)


def test_setting_intervals_scale_with_the_throughput_s():
    table = utilisation.with_utilisation(cells(), FLOOR)
    settings = pd.DataFrame(
        {
            "cells": ["c0"],
            "devices": [2],
            "samples_per_s": [100.0],
            "samples_per_s_low": [90.0],
            "samples_per_s_high": [110.0],
        }
    )
    out = utilisation.settings_with_utilisation(settings, table).iloc[0]
    assert (out["tokens_per_s_low"], out["tokens_per_s"], out["tokens_per_s_high"]) == (92_160, 102_400, 112_640)
    assert out["mfu_low"] == pytest.approx(54.0 / 1979.0) and out["mfu_high"] == pytest.approx(66.0 / 1979.0)
    assert (out["tokens_per_s_per_device_low"], out["tokens_per_s_per_device_high"]) == (46_080, 56_320)
    assert out["perplexity"] == pytest.approx(math.exp(2.0))


def test_a_text_forecast_is_also_in_tokens_per_s_and_an_image_one_is_not():
    table = pd.concat(
        [
            utilisation.with_utilisation(cells(cell="t"), FLOOR),
            utilisation.with_utilisation(cells(cell="i", task="image", tokens_per_sample=None, model="cnn"), FLOOR),
        ]
    )
    table["dataset"], table["model_args"], table["seq_len"] = "d", "{}", pd.NA
    table.loc[table["cell"] == "t", "model"] = "gpt"
    forecasts = pd.DataFrame(
        {
            "dataset": ["d", "d"],
            "model": ["gpt", "cnn"],
            "model_args": ["{}", "{}"],
            "seq_len": [pd.NA, pd.NA],
            "predicted_samples_per_s": [10.0, 10.0],
            "predicted_low": [8.0, 8.0],
            "predicted_high": [12.0, 12.0],
            "measured_samples_per_s": [11.0, math.nan],
        }
    )
    out = utilisation.forecasts_in_tokens(forecasts, table)
    text, image = out.iloc[0], out.iloc[1]
    assert (text["predicted_tokens_low"], text["predicted_tokens_per_s"], text["predicted_tokens_high"]) == (
        8192,
        10240,
        12288,
    )
    assert text["measured_tokens_per_s"] == 11264 and math.isnan(image["predicted_tokens_per_s"])
