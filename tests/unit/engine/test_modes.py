"""The modes are one table (dpstudy.study.modes): the engine's registry (dpstudy.engine.modes.MODES)
and the study schema's `$defs/mode` and `$defs/shard` that configs are validated against name its
modes and shards, so that a mode added to the table without its class fails here."""

from __future__ import annotations

import torch

from dpstudy.engine.modes import MODES
from dpstudy.study import modes, schema


def test_the_schema_and_the_engine_name_the_modes_of_the_table():
    in_schema = schema.schema()["$defs"]["mode"]["enum"]
    assert set(MODES) == set(in_schema) == set(modes.TABLE)
    assert in_schema[:4] == ["single", "dp", "ddp", "fsdp"]
    # torchrun starts one process per device exactly for the modes whose class joins a process group
    assert {name for name, cls in MODES.items() if cls.distributed} == set(modes.per_device_modes())
    assert {"ddp", "fsdp"} <= set(modes.per_device_modes()) and {"single", "dp"} == set(modes.one_process_modes())
    # every shard of every mode, and none that no mode takes
    shards = schema.schema()["$defs"]["shard"]["enum"]
    assert set(shards) == {s for m in modes.TABLE.values() for s in m.shards}
    assert modes.TABLE["fsdp"].shards == ("full", "grad_op", "hybrid") and modes.TABLE["ddp"].shards == ("none",)


def test_a_mode_knows_its_fsdp_shard_and_its_ranks_partition_of_the_data():
    fsdp = MODES["fsdp"](device=torch.device("cpu"), gpus=2, backend="gloo", shard="grad_op", rank=1, world_size=2)
    assert fsdp.shard == "grad_op" and (fsdp.partition.rank, fsdp.partition.world) == (1, 2)


def test_mode_for_hands_a_mode_its_checkpointing_and_hybrids_replicas():
    from dpstudy.engine.modes import mode_for
    from dpstudy.study.spec import complete

    spec = complete(
        {"dataset": "synthetic", "model": "lenet", "mode": "fsdp", "gpus": 4, "backend": "gloo", "shard": "hybrid"}
        | {"replicate": 2, "activation_checkpointing": "selective"}
    )
    env = {"WORLD_SIZE": "4", "RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}
    mode = mode_for(spec, env)
    assert (mode.shard, mode.options, mode.checkpointing, mode.rank) == ("hybrid", {"replicate": 2}, "selective", 1)
    # two nodes without replicate: a replica per node; other shardings take no replicas
    two_nodes = {**spec, "gpus": 2, "nodes": 2, "replicate": None}
    assert MODES["fsdp"].options_of(two_nodes) == {"replicate": 2}
    assert MODES["fsdp"].options_of({**spec, "shard": "full", "replicate": None}) == {}
    single = mode_for(complete({"dataset": "synthetic", "model": "lenet", "mode": "single"}), {})
    assert single.checkpointing == "none"
