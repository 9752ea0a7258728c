"""gpu-check item 8 (dpstudy.gpucheck.scaling) on tables generated from the step model's own law:
settings on 4 GPUs forecast from 1 and 2 alone are recovered, a slower 4-GPU measurement shows as
its error outside the interval, and a host with fewer than 3 GPUs is told the item does not apply."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from helpers.records import CURRENT, comm_fit, make_record

from dpstudy.analysis import stats
from dpstudy.analysis.tables import cells_table
from dpstudy.gpucheck import registry, scaling, summary, worker
from dpstudy.workflow.planning import load_study

FIXED_S, PER_SAMPLE_S = 2e-3, 5e-5  # one device's step: t1(b) = FIXED_S + PER_SAMPLE_S b
SHARE_AT_2 = 1.2  # two ranks' slow-down on the shared host; grows linearly with the ranks
HIDDEN = 0.5  # the share of the priced all-reduce left exposed
LATENCY_S, GBPS, GRAD_BYTES = 40e-6, 2.0, 4_000_000
FITS = pd.DataFrame([comm_fit(LATENCY_S, GBPS)])
GLOBAL = 256


def t1(b: float) -> float:
    return FIXED_S + PER_SAMPLE_S * b


def ring_allreduce_s(n: int) -> float:
    """The fit at 2 ranks carried to n over the ring, as the forecast carries it."""
    return LATENCY_S * (n - 1) + GRAD_BYTES * 2 * (n - 1) / n / (GBPS * 1e9)


def ddp_step(n: int) -> float:
    share = 1 + (SHARE_AT_2 - 1) * (n - 1)
    return t1(GLOBAL / n) * share + HIDDEN * ring_allreduce_s(n)


def tables(four_gpus_slower: float = 1.0) -> dict[str, pd.DataFrame]:
    """One device at 64, 128, 256; DDP at a global 256 on 2 and 4 ranks; two repeats within 1 %."""
    recs = []
    for b in (64, 128, 256):
        for k, wobble in enumerate((0.99, 1.01)):
            recs.append(make_record(samples_per_s=b / t1(b) * wobble, batch=b, repeat=k, suffix=f"-r{k}"))
    for n in (2, 4):
        exposed = HIDDEN * ring_allreduce_s(2)  # the probe's step with and without its all-reduce
        probe = {"sync_step_s": 0.01 + exposed, "nosync_step_s": 0.01, "allreduce_s": 0.001, "grad_bytes": GRAD_BYTES}
        measured = GLOBAL / ddp_step(n) * (four_gpus_slower if n == 4 else 1.0)
        for k, wobble in enumerate((0.99, 1.01)):
            recs.append(
                make_record(
                    samples_per_s=measured * wobble,
                    mode="ddp",
                    gpus=n,
                    backend="gloo",
                    batch=GLOBAL,
                    probe=probe,
                    repeat=k,
                    suffix=f"-r{k}",
                )
            )
    cells = cells_table([(f"results/cells/{r['cell']}/record.json", r) for r in recs], CURRENT["source_hash"])
    return {"settings": stats.settings_table(cells), "cells": cells, "comm_fit": FITS}


def test_settings_beyond_two_gpus_are_forecast_from_one_and_two_alone():
    result = scaling.evaluate(tables())
    (row,) = result["data"]["forecasts"]
    assert (row["scheme"], row["devices"], row["global_batch"]) == ("ddp", 4, GLOBAL)
    assert row["predicted_samples_per_s"] == pytest.approx(GLOBAL / ddp_step(4), rel=0.01)
    assert row["how"] == "extrapolated" and "4 ranks extrapolated from 2" in row["basis"] and row["inside"]
    figures = result["figures"]
    assert figures["scaling_checked"] == 1 and figures["scaling_median_error"] < 0.01
    assert figures["scaling_inside"] == 1.0
    assert result["details"]["scaling_median_error"] == "1 settings on 4 GPUs, calibrated on 1 and 2"


def test_the_four_gpu_cells_are_never_read_by_their_forecast():
    made = scaling.evaluate(tables(four_gpus_slower=0.8))
    (row,) = made["data"]["forecasts"]
    assert row["predicted_samples_per_s"] == pytest.approx(GLOBAL / ddp_step(4), rel=0.01)  # as before
    assert row["error"] == pytest.approx(1 / 0.8 - 1, abs=0.01) and not row["inside"]
    assert made["figures"]["scaling_max_error"] == pytest.approx(0.25, abs=0.01)
    assert any("ddp on 4 GPUs at 256: forecast" in note and "+25" in note for note in made["notes"])
    # the verdict: 25 % misses the 10 % median target
    raw = {"status": "ok", "figures": made["figures"], "details": made["details"]}
    assert summary.evaluate(registry.BY_NAME["scaling"], raw).verdict == "FAIL"


def test_without_a_setting_beyond_two_gpus_nothing_is_checked_and_it_says_why():
    two_only = tables()
    cells = two_only["cells"]
    cells = cells[cells["gpus"] != 4]
    made = scaling.evaluate({**two_only, "cells": cells, "settings": stats.settings_table(cells)})
    assert made["figures"] == {"scaling_checked": 0} and made["data"]["forecasts"] == []
    assert made["details"]["scaling_median_error"] == "no setting on more than 2 GPUs ran (GPU counts: [2])"


def test_the_study_runs_every_power_of_two_and_the_visible_count_with_their_per_device_batches():
    assert scaling.device_counts(8) == [2, 4, 8] and scaling.device_counts(6) == [2, 4, 6]
    assert scaling.device_counts(3) == [2, 3] and scaling.device_counts(1) == []
    grids = {s["name"]: s["grid"] for s in scaling.study(8)["sweeps"]}
    assert grids["one"]["batch"] == [128, 256, 512, 1024]  # 1024 over 1, 2, 4, 8 GPUs
    assert grids["ddp"] == {"mode": ["ddp"], "gpus": [2, 4, 8], "batch": [1024], "backend": ["nccl"]}
    assert grids["fsdp"]["shard"] == ["full"] and grids["fsdp"]["gpus"] == [2, 4, 8]
    # a study the loader accepts (every key and value valid), planned as on an 8-GPU host
    cells = load_study(scaling.study(8), user_check=None, visible_gpus=8, capabilities=[(9, 0)] * 8).cells
    runs = {(c.spec["mode"], c.spec["gpus"], c.spec["batch"]) for c in cells}
    assert runs == {("single", 1, b) for b in (128, 256, 512, 1024)} | {
        (mode, n, 1024) for mode in ("ddp", "fsdp") for n in (2, 4, 8)
    }
    assert {c.spec["backend"] for c in cells if c.spec["mode"] != "single"} == {"nccl"}
    assert len(cells) == 2 * len(runs)  # two repeats


def test_a_host_with_too_few_gpus_records_the_item_as_not_applicable(tmp_path, monkeypatch):
    class OneGpu(registry.Item):
        def run(self, out):
            return {"not_applicable": "needs 3 or more GPUs (calibrates on 1-2); 1 visible"}

    item = registry.BY_NAME["scaling"]
    monkeypatch.setitem(worker.BY_NAME, "scaling", OneGpu(item.name, item.title, "x:y", item.figures, 10))
    assert worker.run("scaling", tmp_path) == 0
    raw = json.loads((tmp_path / "raw" / "scaling.json").read_text())
    assert raw["status"] == "not applicable" and raw["error"].endswith("1 visible")
    verdict = summary.evaluate(item, raw)
    assert verdict.verdict == "not run" and summary.exit_status([verdict]) == 0
    assert verdict.rows[0].measured == "not applicable: needs 3 or more GPUs (calibrates on 1-2); 1 visible"
    assert "- not applicable here: needs 3 or more GPUs" in summary.render({"scaling": raw}, [])
