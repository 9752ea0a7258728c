"""A shard hybrid (HSDP) cell through every table: its strategy beside DDP's in one workload, its
single-device baseline, and no model that does not know it: the step model's breakdown leaves its
collectives unpriced (its exposed communication measured all the same), the forecasts neither
calibrate on it nor forecast it, and say why."""

from __future__ import annotations

import pandas as pd
import pytest
from helpers.records import CURRENT, comm_fit, make_record, write_records

from dpstudy.analysis import collect, forecast_table

FSDP_PROBE = {
    "sync_step_s": 0.012,
    "nosync_step_s": 0.01,
    "grad_bytes": 250_000,
    "gather_bytes": 250_000,
    "units": 4,
    "allgather_s": 0.001,
    "reduce_scatter_s": 0.001,
}
DDP_PROBE = {"sync_step_s": 0.011, "nosync_step_s": 0.01, "allreduce_s": 0.001, "grad_bytes": 250_000, "units": 4}


def records() -> list[dict]:
    out = [make_record(batch=b, samples_per_s=1000.0 + b) for b in (64, 128)]
    out += [
        make_record(mode="ddp", gpus=2, backend="gloo", batch=b, samples_per_s=1500.0 + b, probe=DDP_PROBE)
        for b in (64, 128)
    ]
    hybrid = {"mode": "fsdp", "gpus": 4, "backend": "gloo", "shard": "hybrid", "replicate": 2}
    out.append(make_record(**hybrid, batch=64, samples_per_s=2000.0, probe=FSDP_PROBE, suffix="-replicate2"))
    return out


ASKED = {"gpus": 4, "nodes": 1, "batch": 64, "backend": "gloo", "dataset": None, "model": None}
REQUESTS = [{**ASKED, "mode": "fsdp", "shard": "hybrid"}, {**ASKED, "mode": "ddp", "shard": "none"}]


@pytest.fixture
def tables(tmp_path) -> dict[str, pd.DataFrame]:
    return collect.summarise(collect.collect(write_records(tmp_path, records()), CURRENT), requests=REQUESTS)


HYBRID = "synthetic-lenet-fsdp-g4-b64-gloo-replicate2"


def test_a_hybrid_cell_has_its_baseline_and_ranks_beside_ddp(tables):
    cells = tables["cells"].set_index("cell")
    assert cells.loc[HYBRID, "baseline"] == "synthetic-lenet-single-g1-b64-none"  # replicate: no single's
    assert cells.loc[HYBRID, "speedup"] == pytest.approx(2000 / 1064)
    strategies = tables["strategies"]
    hybrid = strategies[strategies["shard"] == "hybrid"]
    assert len(hybrid) == 1 and hybrid["replicate"].iloc[0] == 2
    ddp = strategies[(strategies["mode"] == "ddp") & (strategies["batch"] == 64)]
    assert hybrid["workload_id"].iloc[0] == ddp["workload_id"].iloc[0]  # replicate is the strategy's


def test_no_model_prices_hybrids_collectives_and_the_forecasts_say_so(tables):
    scaling = tables["scaling"].set_index("cell")
    hybrid = scaling.loc[HYBRID]
    assert hybrid["scheme"] == "fsdp hybrid" and pd.isna(hybrid["comm_s"]) and pd.isna(hybrid["overlap"])
    assert hybrid["exposed_s"] == pytest.approx(0.002) and hybrid["exposed_source"] == "probe"
    assert hybrid["step_s"] == pytest.approx(hybrid["predicted_s"] + hybrid["residual_s"])
    fits = pd.DataFrame([comm_fit(50e-6, 1.0)])  # an all-reduce fit: DDP settings calibrate
    forecasts = forecast_table.forecasts(tables["settings"], tables["cells"], fits, REQUESTS, tables["memory_split"])
    assert (forecasts["source"] == "leave-one-out").sum() == 2  # the two DDP settings, each from the other
    assert not ((forecasts["source"] == "leave-one-out") & (forecasts["shard"] == "hybrid")).any()
    (asked,) = forecasts[(forecasts["source"] == "requested") & (forecasts["shard"] == "hybrid")].to_dict("records")
    assert asked["how"] == "not forecast" and asked["basis"].startswith("fsdp hybrid is not forecast")
    (ddp,) = forecasts[(forecasts["source"] == "requested") & (forecasts["mode"] == "ddp")].to_dict("records")
    assert ddp["how"] == "extrapolated"
