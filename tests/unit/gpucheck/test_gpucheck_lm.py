"""gpu-check's `lm` item (dpstudy.gpucheck.lm) without a GPU: the model it measures and its FLOPs,
MFU against the peak table, the memory plan against made-up allocator peaks, how its figures read
and are judged in summary.md, and the whole measurement on the CPU at a tiny size (eager: the
compiled path runs only on the GPU host)."""

from __future__ import annotations

import json
import math
import shutil

import pytest
from helpers import REPO

from dpstudy.gpucheck import lm, lm_figures, registry, summary

ITEM = registry.BY_NAME["lm"]
H100 = "NVIDIA H100 80GB HBM3"
GPT2_FLOPS = 6 * (12 * 12 * 768**2 + 50257 * 768) + 12 * 12 * 768 * 1024  # 6N + 12 L d T a token


def throughput(tokens_per_s: float = 400_000.0, loss_s: float = 0.008) -> dict:
    """A made-up lm.measure_throughput record: 3 steady epochs of 25 steps of 16,384 tokens."""
    step_s = 16_384 / tokens_per_s
    return {
        "tokens_per_s": tokens_per_s,
        "step_s": step_s,
        "steady_s": 75 * step_s,
        "steady_steps": 75,
        "epoch_tokens_per_s": [tokens_per_s * 0.99, tokens_per_s, tokens_per_s * 1.01],
        "warmup_s": 62.0,
        "compile_s": 55.3,
        "steady_compile_s": 0.0,
        "first_loss": 9.81,
        "final_loss": 5.61,
        "loss_finite": True,
        "loss_s": loss_s,
    }


def split(allocated: float | None, peak: float, activations: float, **more) -> dict:
    """A made-up per-device split (memory_plan.predict's or memory.measure's first device)."""
    parts = {"params_mb": 475.0, "grads_mb": 475.0, "optimizer_mb": 950.0, "activations_mb": activations}
    return {**parts, "peak_mb": peak, "allocated_mb": allocated, **more}


def memory_rows(full_predicted: float = 9_000.0) -> dict:
    return {
        "none": {
            "predicted": split(21_000.0, 20_900.0, 19_000.0, workspace_mb=64.0),
            "measured": split(20_000.0, 19_800.0, 17_900.0, reserved_mb=21_500.0, context_mb=530.0),
            "errors": [],
        },
        "full": {
            "predicted": split(full_predicted, 8_900.0, 7_000.0, workspace_mb=64.0),
            "measured": split(10_500.0, 10_300.0, 8_400.0, reserved_mb=11_000.0, context_mb=530.0),
            "errors": [],
        },
    }


def made(device_name: str = H100, **throughput_args) -> dict:
    return {
        "device_name": device_name,
        "params": 124_439_808,
        "flops_per_token": float(GPT2_FLOPS),
        "memory": memory_rows(),
        "throughput": throughput(**throughput_args),
    }


def verdicts(result: dict) -> dict[str, tuple[str, str]]:
    """{figure key: (measured text, verdict)} as summary.md shows them."""
    rows = summary.evaluate(ITEM, {"status": "ok", **result}).rows
    return {f.key: (row.measured, row.verdict) for f, row in zip(ITEM.figures, rows, strict=True)}


def test_the_item_is_gpt2_small_with_gpt2s_vocabulary_and_counts_6n_plus_12ldt_a_token():
    spec = lm.lm_spec(compiled=True)
    assert (spec["model"], spec["model_args"], spec["seq_len"], spec["batch"]) == ("gpt", lm.MODEL_ARGS, 1024, 16)
    assert spec["model_args"] == {"size": "gpt2", "vocab_size": 50257}
    assert (spec["precision"], spec["compile"], spec["optimizer"], spec["mode"]) == ("bf16", True, "adam", "single")
    assert (spec["loader"], spec["activation_checkpointing"], spec["warmup_steps"]) == ("device", "none", lm.STEPS)
    assert lm.lm_spec("full")["activation_checkpointing"] == "full" and not lm.lm_spec("full")["compile"]
    params, per_token = lm.count(spec)
    assert params == 124_439_808  # GPT-2 small: tied embeddings, learned positions, biases
    assert per_token == GPT2_FLOPS == 854_438_400
    assert lm.vocab_of(spec) == 50257 and lm.vocab_of(lm.lm_spec(model_args={"size": "tiny"}, seq_len=32)) == 256


def test_mfu_takes_the_devices_own_dense_bf16_peak_and_none_for_a_device_not_in_the_table():
    assert lm_figures.peak_of(H100)[:2] == (989.5, "H100 SXM dense BF16")
    assert "H100 datasheet" in lm_figures.peak_of(H100)[2]
    assert lm_figures.peak_of("NVIDIA H200")[:2] == (989.5, "H200 SXM dense BF16")
    assert lm_figures.peak_of("NVIDIA H100 PCIe")[0] == 756.5
    assert lm_figures.peak_of("NVIDIA A10G") == (None, "unknown: NVIDIA A10G is not in dpstudy.util.peaks", None)
    assert lm_figures.mfu(400_000, GPT2_FLOPS, 989.5) == pytest.approx(400_000 * 854_438_400 / 989.5e12)
    assert lm_figures.mfu(400_000, GPT2_FLOPS, None) is None


def test_throughput_figures_and_the_40_percent_target():
    result = lm_figures.lm_result(made(), lm.lm_spec(compiled=True))
    f = result["figures"]
    assert f["mfu"] == pytest.approx(0.3454, abs=1e-4)  # 400,000 tokens/s x 854 MFLOP / 989.5 TFLOP/s
    assert f["achieved_tflops"] == pytest.approx(341.78, abs=0.01)
    assert f["step_ms"] == pytest.approx(40.96) and f["loss_share"] == pytest.approx(8 / 40.96)
    # the same tokens in the step less the loss: 16,384 tokens in 32.96 ms
    assert f["mfu_without_loss"] == pytest.approx(16_384 / 0.03296 * GPT2_FLOPS / 989.5e12)
    shown = verdicts(result)
    assert shown["mfu"] == ("35 % of 989.5 TFLOP/s, H100 SXM dense BF16", "FAIL")
    assert shown["tokens_per_s"][0].startswith("400,000 tokens/s (75 steps in 3.07 s; by epoch 396,000, 400,000")
    assert shown["loss_share"][0].startswith("20 % (8.0 ms: the logits in fp32")
    assert shown["mfu_without_loss"] == ("43 % of 989.5 TFLOP/s: the step in 33.0 ms", "no target")
    assert shown["flops_per_token"] == ("854 MFLOP (124,439,808 parameters)", "no target")
    assert shown["compile_s"][0] == "55.3 s (the warm-up epoch took 62.0 s)"
    assert shown["loss_finite"] == ("yes: loss 9.810 (warm-up epoch) -> 5.610", "PASS")
    assert any(note.startswith("peak: NVIDIA H100 datasheet") for note in result["notes"])
    assert "vocabulary 50,257" in result["notes"][0] and "16,384 tokens a step" in result["notes"][0]
    faster = lm_figures.lm_result(made(tokens_per_s=480_000.0), lm.lm_spec(compiled=True))
    assert faster["figures"]["mfu"] == pytest.approx(0.4145, abs=1e-4) and verdicts(faster)["mfu"][1] == "PASS"
    assert json.loads(json.dumps(faster)) == faster  # the raw record is plain JSON


def test_a_device_not_in_the_table_has_no_mfu_and_fails_with_the_reason():
    result = lm_figures.lm_result(made("NVIDIA A10G"), lm.lm_spec(compiled=True))
    assert result["figures"]["mfu"] is None and result["figures"]["mfu_without_loss"] is None
    assert result["figures"]["achieved_tflops"] == pytest.approx(341.78, abs=0.01)
    assert verdicts(result)["mfu"] == ("unknown: NVIDIA A10G is not in dpstudy.util.peaks", "FAIL")
    assert not any(note.startswith("peak:") for note in result["notes"])


def test_a_throughput_that_failed_leaves_the_memory_figures_and_says_why():
    record = {**made(), "throughput": {"error": "CompileFailed: torch.compile failed: no C compiler"}}
    shown = verdicts(lm_figures.lm_result(record, lm.lm_spec(compiled=True)))
    assert shown["mfu"] == ("not measured: CompileFailed: torch.compile failed: no C compiler", "FAIL")
    assert shown["loss_finite"][1] == "FAIL" and shown["memory_none_error"][1] == "PASS"


def test_memory_plan_against_the_allocator_with_made_up_numbers():
    result = lm_figures.memory_result(memory_rows())
    f = result["figures"]
    assert f["memory_none_error"] == pytest.approx(0.05)  # 21,000 planned vs 20,000 allocated
    assert f["memory_full_error"] == pytest.approx(1 - 9_000 / 10_500)  # -14.3 %
    assert f["checkpointing_saving_mb"] == pytest.approx(9_500.0)
    assert result["details"]["checkpointing_saving_mb"] == "planned 12,000 MB"
    assert result["details"]["memory_full_error"] == "plan 9,000 MB, below max_memory_allocated 10,500 MB"
    assert result["notes"][0].startswith("checkpointing none: plan 21,000.0 MB = fake step 20,900.0 (params 475.0")
    assert "+5.0%" in result["notes"][0] and "-14.3%" in result["notes"][1]
    shown = verdicts(lm_figures.lm_result(made(), lm.lm_spec(compiled=True)))
    assert shown["memory_none_error"] == ("5 % (plan 21,000 MB, above max_memory_allocated 20,000 MB)", "PASS")
    assert shown["memory_full_error"][1] == "FAIL" and shown["checkpointing_saving_mb"][0].startswith("9,500 MB")
    within = lm_figures.memory_result(memory_rows(full_predicted=10_000.0))["figures"]
    assert within["memory_full_error"] == pytest.approx(1 / 21) and ITEM.figures[10].target.met(1 / 21)
    # a plan that failed, and a step with no allocator (the CPU): no figure, and why
    rows = memory_rows()
    rows["none"] = {"predicted": None, "measured": rows["none"]["measured"], "errors": ["the plan: RuntimeError: x"]}
    rows["full"]["measured"] = {"peak_mb": 10.0, "rss_growth_mb": 12.0}
    broken = lm_figures.memory_result(rows)
    assert broken["figures"] == {}
    assert broken["details"]["memory_none_error"] == "not measured: the plan: RuntimeError: x"
    assert broken["details"]["memory_full_error"] == "not measured: no allocator peak measured (not on CUDA)"


def test_summary_md_shows_the_lm_item(tmp_path):
    out = tmp_path / "gc"
    shutil.copytree(REPO / "tests" / "data" / "gpucheck" / "h100-all-pass", out)
    result = lm_figures.lm_result(made(tokens_per_s=480_000.0), lm.lm_spec(compiled=True))
    raw = {"schema": "dpstudy.gpucheck-raw/1", "item": "lm", "title": ITEM.title, "status": "ok", **result}
    (out / "raw" / "lm.json").write_text(json.dumps(raw))
    path, found = summary.write(out)
    assert {v.name: v.verdict for v in found}["lm"] == "FAIL"  # checkpointing full's plan is 14 % low
    text = path.read_text()
    assert "| 5 lm | MFU (dense BF16 peak): the Trainer's compiled step | 41 % of 989.5 TFLOP/s" in text
    assert "| 6 grayscale |" in text and "### 5 lm: GPT-2 small" in text


def test_the_item_measures_on_the_cpu_at_a_tiny_size():
    settings = {"model_args": {"size": "tiny"}, "seq_len": 32, "batch": 4, "warmup_steps": 2}
    record = lm.measure("cpu", compiled=False, min_steady_s=0.0, **settings)
    assert record["device_name"] == "cpu" and record["params"] > 0
    assert record["flops_per_token"] == 6 * (12 * 2 * 64**2 + 256 * 64) + 12 * 2 * 64 * 32
    t = record["throughput"]
    assert "error" not in t, t
    assert t["steady_steps"] == 2 and t["tokens_per_s"] > 0 and t["loss_finite"] and 0 < t["loss_s"]
    assert math.isclose(t["tokens_per_s"] * t["step_s"], 4 * 32)
    for how in lm_figures.HOWS:
        row = record["memory"][how]
        assert row["errors"] == [], row
        # on a CPU no allocator: the plan's fake step against the tracker's real one
        assert "allocated_mb" not in row["measured"] and row["predicted"]["workspace_mb"] is None
        assert row["predicted"]["peak_mb"] == pytest.approx(row["measured"]["peak_mb"], rel=0.10)
    result = lm_figures.lm_result(record, lm.lm_spec(**settings))
    assert set(result["figures"]) >= {"tokens_per_s", "achieved_tflops", "loss_share", "flops_per_token"}
    assert result["figures"]["mfu"] is None and "memory_none_error" not in result["figures"]
    assert summary.evaluate(ITEM, {"status": "ok", **json.loads(json.dumps(result))}).verdict == "FAIL"
