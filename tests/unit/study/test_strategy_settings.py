"""The strategy's memory settings: activation_checkpointing, and shard hybrid with its replicate
(dpstudy.study.spec.replicate_gap), in specs, studies and cell ids."""

from __future__ import annotations

import pytest

from dpstudy.study import modes, sweeps
from dpstudy.study import spec as specs
from dpstudy.util.errors import ConfigError

FSDP = {"dataset": "synthetic", "model": "lenet", "mode": "fsdp", "backend": "gloo"}


def cells(*sweep_list: dict) -> dict:
    return {c.id: c for c in sweeps.expand(sweeps.load({"sweeps": list(sweep_list)}))}


def test_null_settings_stay_out_of_every_cells_params():
    # a cell made before these settings existed keeps its params: no rerun
    (cell,) = cells({"name": "a", "dataset": "synthetic", "model": "lenet", "grid": {"mode": ["single"]}}).values()
    assert cell.spec["activation_checkpointing"] is None and cell.spec["replicate"] is None
    assert "activation_checkpointing" not in cell.params() and "replicate" not in cell.params()
    checkpointed = specs.complete({**FSDP, "activation_checkpointing": "selective"})
    assert checkpointed["activation_checkpointing"] == "selective"
    with pytest.raises(ConfigError, match="activation_checkpointing"):
        specs.complete({**FSDP, "activation_checkpointing": "partial"})


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"gpus": 4, "shard": "hybrid"}, "shard 'hybrid' on one node needs replicate"),
        ({"gpus": 4, "shard": "hybrid", "replicate": 1}, "replicate 1 is one replica, which is shard 'full'"),
        ({"gpus": 4, "shard": "hybrid", "replicate": 3}, "replicate 3 does not divide the cell's 4 devices"),
        ({"gpus": 4, "shard": "hybrid", "replicate": 4}, "replicate 4 over 4 devices leaves one device a replica"),
        ({"gpus": 4, "shard": "full", "replicate": 2}, "replicate 2 is the replica count of mode 'fsdp' with shard"),
        ({"mode": "ddp", "gpus": 4, "replicate": 2}, "got mode 'ddp' with shard 'none'"),
        ({"mode": "ddp", "gpus": 4, "shard": "hybrid"}, "mode 'ddp' takes shard 'none'"),
    ],
)
def test_hybrid_rules_name_the_key_and_value(settings, message):
    with pytest.raises(ConfigError, match=message):
        specs.complete({**FSDP, **settings})


def test_hybrid_takes_one_replica_per_node_unless_replicate_says_otherwise():
    two_nodes = specs.complete({**FSDP, "gpus": 2, "nodes": 2, "shard": "hybrid"})
    assert specs.replicas(two_nodes) == 2
    assert specs.replicas(specs.complete({**FSDP, "gpus": 4, "shard": "hybrid", "replicate": 2})) == 2
    assert specs.replicas(specs.complete({**FSDP, "gpus": 4, "nodes": 2, "shard": "hybrid", "replicate": 2})) == 2
    assert "hybrid" in modes.TABLE["fsdp"].shards and specs.shard_of("fsdp", "hybrid") == "hybrid"
    assert specs.shard_of("ddp", "hybrid") == "none"


def test_the_cell_id_names_replicate_and_checkpointing_only_where_a_sweep_sets_them():
    grid = {"mode": ["fsdp"], "gpus": [4], "backend": ["gloo"], "shard": ["hybrid"]}
    by_id = cells(
        {"name": "hsdp", "dataset": "synthetic", "model": "lenet", "grid": grid, "set": {"replicate": 2}},
        {
            "name": "nodes",
            "dataset": "synthetic",
            "model": "lenet",
            "grid": {**grid, "gpus": [2], "nodes": [2], "activation_checkpointing": ["full"]},
        },
    )
    assert set(by_id) == {
        "synthetic-lenet-fsdp-g4-b64-gloo-replicate2-shardhybrid",
        "synthetic-lenet-fsdp-g2-b64-gloo-nodes2-activation_checkpointingfull-shardhybrid",
    }
    nodes = by_id["synthetic-lenet-fsdp-g2-b64-gloo-nodes2-activation_checkpointingfull-shardhybrid"]
    assert nodes.spec["replicate"] is None and nodes.params()["activation_checkpointing"] == "full"
