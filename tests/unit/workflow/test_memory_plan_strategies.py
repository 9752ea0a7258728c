"""The memory plan's prediction of shard hybrid (HSDP over a fake 2-D mesh) and of activation
checkpointing (dpstudy.workflow.memory_plan). Against a real tracked step: tests/unit/engine/
test_checkpointing.py."""

import pytest

from dpstudy.study.spec import complete
from dpstudy.workflow import memory_plan

# each device the same batch, so that only what the strategy shards differs
RESNET = {"dataset": "synthetic", "model": "resnet18", "batch": 8, "batch_scope": "per_device"}
FSDP = {**RESNET, "mode": "fsdp", "backend": "gloo"}


def predicted(**settings) -> dict:
    return memory_plan.predict(complete({**FSDP, **settings}))


def test_hybrid_holds_a_shard_of_its_replica_not_of_the_world():
    hybrid = predicted(gpus=4, shard="hybrid", replicate=2)
    over_four, over_two = predicted(gpus=4), predicted(gpus=2)
    assert len(hybrid["peak_mb"]) == 4
    # 4 devices as 2 replicas of 2: each device holds half the state, as full sharding over 2 does,
    # twice what full sharding over all 4 leaves it
    for part in ("params_mb", "grads_mb", "optimizer_mb", "activations_mb", "peak_mb"):
        assert hybrid[part][0] == pytest.approx(over_two[part][0], rel=1e-9), part
    assert hybrid["optimizer_mb"][0] == pytest.approx(2 * over_four["optimizer_mb"][0], rel=0.01)
    # params at the step's peak also hold the unit gathered for compute, which is not sharded
    assert over_four["params_mb"][0] < hybrid["params_mb"][0] < 2 * over_four["params_mb"][0]
    # two nodes without replicate: one replica per node, the same mesh
    nodes = predicted(gpus=2, nodes=2, shard="hybrid")
    assert nodes["optimizer_mb"][0] == pytest.approx(hybrid["optimizer_mb"][0], rel=1e-9)


def test_hybrid_and_full_over_one_world_are_different_fake_steps():
    full = complete({**FSDP, "gpus": 4})
    assert memory_plan.step_key(full) != memory_plan.step_key({**full, "shard": "hybrid", "replicate": 2})


def test_checkpointing_lowers_the_predicted_activations_under_fsdp():
    plain = predicted(gpus=2)
    full = predicted(gpus=2, activation_checkpointing="full")
    selective = predicted(gpus=2, activation_checkpointing="selective")
    assert full["activations_mb"][0] < selective["activations_mb"][0] < plain["activations_mb"][0]
    assert full["optimizer_mb"] == plain["optimizer_mb"]  # the state is the model's, as before
