"""The memory plan of ZeRO cells (dpstudy.workflow.memory_plan.sharded_parts): DeepSpeed cannot run
on fake tensors, so a ZeRO cell's device is the plain model's fake step changed by its scheme's
facts in the modes' table. Checked here against the plain step's own parts; against measured
steps in tests/unit/engine/test_train.py and tests/e2e/test_lm_study.py."""

from __future__ import annotations

import pytest

from dpstudy.study.spec import complete
from dpstudy.workflow import memory_plan

LENET = {"dataset": "synthetic", "model": "lenet", "batch": 64, "optimizer": "sgd"}
ZERO = {**LENET, "mode": "deepspeed", "gpus": 2, "backend": "gloo", "reduce_bucket_size": 100_000}
MB = 2**20
BUCKET_MB = 100_000 * 4 / MB  # fp32 gradients


def plan(**settings) -> dict:
    return {k: v[0] for k, v in memory_plan.predict(complete(settings)).items() if k.endswith("_mb")}


@pytest.fixture(scope="module")
def plain() -> dict:
    """One device at the per-device batch (32): the fake step every ZeRO cell here starts from."""
    return plan(**{**LENET, "mode": "single", "batch": 32})


def test_each_stage_shards_what_its_row_says_beside_an_fp32_master(plain):
    zero1, zero2 = plan(**ZERO, shard="zero1"), plan(**ZERO, shard="zero2")
    zero3 = plan(**ZERO, shard="zero3", stage3_param_persistence_threshold=0)
    p, momentum = plain["params_mb"], plain["optimizer_mb"]
    assert momentum == pytest.approx(p, rel=0.01)  # SGD's momentum: one copy of the parameters
    for made in (zero1, zero2, zero3):  # the optimizer's state and the master copy, each half
        assert made["optimizer_mb"] == pytest.approx(momentum / 2 + p / 2)
    assert zero1["params_mb"] == zero2["params_mb"] == pytest.approx(p) and zero3["params_mb"] == pytest.approx(p / 2)
    assert zero1["grads_mb"] == pytest.approx(plain["grads_mb"] + BUCKET_MB)  # every gradient, and the bucket
    assert zero2["grads_mb"] == zero3["grads_mb"] == pytest.approx(plain["grads_mb"] / 2 + BUCKET_MB)
    # ZeRO-3's gathered parameters and their gradients live beside its shards during the step
    assert zero3["activations_mb"] == pytest.approx(plain["activations_mb"] + 2 * p)
    for made in (zero1, zero2, zero3):
        parts = made["params_mb"] + made["grads_mb"] + made["optimizer_mb"] + made["activations_mb"]
        assert made["peak_mb"] == pytest.approx(parts)


def test_defaults_keep_small_parameters_whole_and_allocate_deepspeeds_bucket(plain):
    # every LeNet parameter is under 100,000 elements: ZeRO-3 keeps them all whole by default
    whole = plan(**{**ZERO, "reduce_bucket_size": None}, shard="zero3")
    assert whole["params_mb"] == pytest.approx(plain["params_mb"])
    # 500 million fp32 elements: 1,907 MB a device, whatever the model
    assert whole["grads_mb"] == pytest.approx(plain["grads_mb"] / 2 + 500_000_000 * 4 / MB)


def test_bf16_casts_the_module_and_keeps_the_master_and_the_state_in_fp32(plain):
    wide, narrow = plan(**ZERO, shard="zero1"), plan(**ZERO, shard="zero1", precision="bf16")
    assert narrow["params_mb"] == pytest.approx(wide["params_mb"] / 2)
    assert narrow["grads_mb"] == pytest.approx(wide["grads_mb"] / 2)  # bf16 gradients and a bf16 bucket
    assert narrow["optimizer_mb"] == pytest.approx(wide["optimizer_mb"])
