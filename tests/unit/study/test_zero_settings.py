"""mode deepspeed in a study: its ZeRO stages beside FSDP's shards in one grid, its knobs, and every
bad input refused before any job with the key and value named (issue 64)."""

from __future__ import annotations

import importlib.util

import pytest

from dpstudy.study import modes, sweeps
from dpstudy.study import spec as specs
from dpstudy.study.schema import schema
from dpstudy.util.errors import ConfigError

ZERO = {"dataset": "synthetic", "model": "lenet", "mode": "deepspeed", "gpus": 2, "backend": "gloo"}


def cells(*sweep_list: dict) -> dict:
    return {c.id: c for c in sweeps.expand(sweeps.load({"sweeps": list(sweep_list)}))}


def test_one_grid_names_every_sharding_and_each_mode_takes_its_own():
    grid = {"mode": ["ddp", "fsdp", "deepspeed"], "shard": ["full", "grad_op", "zero1", "zero2", "zero3"]}
    grid |= {"gpus": [2], "backend": ["gloo"]}
    made = cells({"name": "all", "dataset": "synthetic", "model": "lenet", "grid": grid})
    assert sorted((c.spec["mode"], c.spec["shard"]) for c in made.values()) == [
        ("ddp", "none"),
        ("deepspeed", "zero1"),
        ("deepspeed", "zero2"),
        ("deepspeed", "zero3"),
        ("fsdp", "full"),
        ("fsdp", "grad_op"),
    ]
    assert "synthetic-lenet-deepspeed-g2-b64-gloo-shardzero2" in made and "synthetic-lenet-ddp-g2-b64-gloo" in made
    # a mode with shards and no shard in the grid takes its first: ZeRO-3, as FSDP takes full
    assert specs.complete(ZERO)["shard"] == "zero3" == modes.TABLE["deepspeed"].default_shard


def test_a_knob_of_one_stage_or_mode_goes_to_its_cells_only():
    grid = {"mode": ["ddp", "deepspeed"], "shard": ["zero2", "zero3"], "gpus": [2], "backend": ["gloo"]}
    made = cells(
        {
            "name": "knobs",
            "dataset": "synthetic",
            "model": "lenet",
            "grid": grid,
            "set": {"reduce_bucket_size": 1_000_000, "stage3_param_persistence_threshold": 0},
        }
    )
    by = {(c.spec["mode"], c.spec["shard"]): c.spec for c in made.values()}
    assert by[("deepspeed", "zero3")]["stage3_param_persistence_threshold"] == 0
    assert by[("deepspeed", "zero2")]["stage3_param_persistence_threshold"] is None
    assert by[("deepspeed", "zero2")]["reduce_bucket_size"] == 1_000_000
    assert by[("ddp", "none")]["reduce_bucket_size"] is None
    # the schema takes the knobs, their defaults and meanings from the modes' table
    settings = schema()["$defs"]["settings"]["properties"]
    assert (
        settings["reduce_bucket_size"]["default"] is None
        and "deepspeed only" in settings["reduce_bucket_size"]["description"]
    )


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"shard": "zero4"}, r"shard: 'zero4' is not one of"),
        ({"shard": "full"}, r"mode 'deepspeed' needs shard 'zero3', 'zero2' or 'zero1', got shard 'full'"),
        (
            {"mode": "fsdp", "shard": "zero2"},
            r"mode 'fsdp' needs shard 'full', 'grad_op' or 'hybrid', got shard 'zero2'",
        ),
        ({"mode": "ddp", "shard": "zero1"}, r"mode 'ddp' takes shard 'none' \(only fsdp and deepspeed shard\)"),
        (
            {"shard": "zero2", "stage3_param_persistence_threshold": 0},
            r"stage3_param_persistence_threshold 0 belongs to shard 'zero3'",
        ),
        (
            {"mode": "ddp", "reduce_bucket_size": 1000},
            r"reduce_bucket_size 1000 is DeepSpeed's ZeRO's: mode deepspeed only, not mode 'ddp'",
        ),
        ({"backend": "none"}, r"mode 'deepspeed' needs backend 'nccl' or 'gloo', got backend 'none'"),
        ({"device": "cuda"}, r"mode 'deepspeed' on CUDA communicates over nccl only, got backend 'gloo'"),
        ({"compile": True}, r"compile: true is not supported with mode 'deepspeed'"),
        ({"reduce_bucket_size": 0}, r"reduce_bucket_size: 0 is less than the minimum of 1"),
    ],
)
def test_bad_zero_settings_are_refused_naming_the_key_and_value(settings, message):
    with pytest.raises(ConfigError, match=message):
        specs.complete({**ZERO, **settings})


def test_a_study_asking_for_deepspeed_without_the_extra_is_refused_naming_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed" else real(name, *a))
    modes.missing_extra.cache_clear()
    try:
        with pytest.raises(
            ConfigError, match=r"mode 'deepspeed' needs the optional package 'deepspeed'.*extra 'deepspeed'"
        ):
            cells(
                {
                    "name": "z",
                    "dataset": "synthetic",
                    "model": "lenet",
                    "grid": {"mode": ["deepspeed"], "gpus": [2], "backend": ["gloo"]},
                }
            )
        # the other modes are untouched
        assert cells({"name": "d", "dataset": "synthetic", "model": "lenet", "grid": {"mode": ["single"]}})
    finally:
        modes.missing_extra.cache_clear()


def test_the_forecast_block_takes_zero_stages_and_refuses_another_modes_shard():
    from dpstudy.study import forecast_requests

    item = {"mode": ["fsdp", "deepspeed"], "shard": ["full", "zero2"], "gpus": [4], "batch": [64], "backend": ["gloo"]}
    asked = forecast_requests.requests({"forecast": [item]})
    assert [(r["mode"], r["shard"]) for r in asked] == [("fsdp", "full"), ("deepspeed", "zero2")]
    with pytest.raises(ConfigError, match=r"forecast #1: shard 'full' is no shard of mode ddp"):
        forecast_requests.requests({"forecast": [{**item, "mode": ["ddp"]}]})
