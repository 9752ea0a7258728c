import json
import re

import pytest

from dpstudy.study.cells import cell_id
from dpstudy.study.spec import complete, devices, global_batch, load_spec, per_device_batch, scaled_lr
from dpstudy.util.errors import ConfigError

BASE = {"dataset": "synthetic", "model": "lenet", "mode": "ddp", "gpus": 2, "batch": 64, "backend": "gloo"}


def test_defaults_come_from_the_schema():
    spec = complete(BASE)
    assert spec["epochs"] == 3 and spec["optimizer"] == "sgd" and spec["lr"] == 0.05
    assert spec["loader"] == "device" and spec["precision"] == "fp32" and spec["data_root"] == "results/data"
    assert list(spec) == sorted(spec)


def test_inline_and_file_specs_agree(tmp_path):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(BASE))
    assert load_spec(str(path)) == load_spec(json.dumps(BASE))


@pytest.mark.parametrize(
    "change, message",
    [
        ({"colour": "red"}, "unknown key 'colour'"),
        ({"optimizer": "lbfgs"}, "optimizer"),
        # a name the registry does not know may be a study's own dataset: the study checks it
        ({"dataset": "Image Net"}, "dataset"),
        ({"model_args": {"width": 2}}, "model 'lenet' takes no model_args 'width': it accepts none"),
        ({"model": "gpt", "model_args": {"depth": 2}}, "model 'gpt' takes no model_args 'depth': it accepts size, "),
        ({"model": "gpt9"}, "model 'gpt9'"),
        ({"batch": 63}, "batch 63 is not divisible by gpus 2"),
        ({"backend": "none"}, "needs backend 'nccl' or 'gloo'"),
        ({"mode": "single"}, "mode 'single' needs gpus 1"),
        (
            {"mode": "fsdp", "bucket_cap_mb": 5},
            "bucket_cap_mb 5 is DistributedDataParallel's: mode ddp only, not mode 'fsdp'",
        ),
        ({"workers": 2}, "workers 2 needs loader 'torch'"),
        ({"epochs": 0}, "epochs"),
        (
            {"mode": "single", "gpus": 1, "backend": "none", "nodes": 2},
            "mode 'single' runs as one process on one node, got nodes 2",
        ),
        ({"mode": "dp", "backend": "none", "nodes": 2}, "mode 'dp' runs as one process on one node, got nodes 2"),
        ({"nodes": 0}, "nodes"),
        ({"nodes": 2, "batch": 6}, "batch 6 is not divisible by nodes x gpus 4"),
    ],
)
def test_bad_specs_name_the_key(change, message):
    with pytest.raises(ConfigError, match=message):
        complete({**BASE, **change})


def test_not_json_is_an_error():
    with pytest.raises(ConfigError, match="neither a JSON object nor a file"):
        load_spec("no-such-file.json")


def test_batch_scope_and_lr_scaling():
    spec = complete({**BASE, "batch": 64})
    assert per_device_batch(spec) == 32 and global_batch(spec) == 64
    spec = complete({**BASE, "batch_scope": "per_device", "lr_scaling": "linear"})
    assert per_device_batch(spec) == 64 and global_batch(spec) == 128
    assert scaled_lr(spec) == pytest.approx(0.1)


def test_cell_ids_are_readable():
    spec = complete({**BASE, "lr": 0.1, "repeat": 2})
    assert cell_id(spec) == "synthetic-lenet-ddp-g2-b64-gloo"
    assert cell_id(spec, ["lr", "batch"], repeats=3) == "synthetic-lenet-ddp-g2-b64-gloo-lr0p1-r2"


def test_nodes_multiply_the_devices_of_a_cell():
    spec = complete({**BASE, "nodes": 2, "batch": 64, "lr_scaling": "linear"})
    assert devices(spec) == 4 and per_device_batch(spec) == 16 and global_batch(spec) == 64
    assert scaled_lr(spec) == pytest.approx(0.2)
    spec = complete({**BASE, "nodes": 2, "batch": 64, "batch_scope": "per_device"})
    assert per_device_batch(spec) == 64 and global_batch(spec) == 256


def test_only_multi_node_cells_name_their_nodes():
    assert cell_id(complete(BASE)) == "synthetic-lenet-ddp-g2-b64-gloo"
    assert cell_id(complete({**BASE, "nodes": 2}), ["nodes", "lr"]) == "synthetic-lenet-ddp-g2-b64-gloo-nodes2-lr0p05"


def test_the_schema_admits_exactly_the_model_libraries_the_registry_builds():
    from dpstudy import models
    from dpstudy.study import schema

    (pattern,) = [p["pattern"] for p in schema.schema()["$defs"]["model"]["anyOf"] if "pattern" in p]
    assert set(re.match(r"\^\(([a-z|]+)\):", pattern).group(1).split("|")) == set(models.LIBRARIES)
    assert set(models.LIBRARIES) == {"torchvision", "timm", "transformers"}
    for library in models.LIBRARIES:  # each is a model a study may name, and a kind the registry knows
        complete({**BASE, "model": f"{library}:resnet18"})
        assert models.kind(f"{library}:resnet18") == library


@pytest.mark.parametrize(
    "change",
    [
        {},
        {"colour": "red"},  # unknown key
        {"optimizer": "lbfgs"},  # not in the enum
        {"gpus": 0},  # below the minimum
        {"gpus": 2.5},  # not an integer
        {"gpus": True},  # a boolean is not an integer
        {"lr": "fast"},
        {"epochs": 2.0},  # an integer in JSON Schema's sense
        {"model_args": {"width": [1, 2]}},
        {"model_args": {"width": (1, 2)}},  # a tuple is no JSON array
        {"lr": float("nan")},
    ],
)
def test_the_key_by_key_check_agrees_with_the_validator(change):
    """schema.check's fast path (each key's value judged once per run) says valid only where the
    full validator does; where it cannot tell, the validator judges and words the error."""
    from dpstudy.study import schema

    for spec in ({**BASE, **change}, {k: v for k, v in {**BASE, **change}.items() if k != "model"}):
        full = schema.validator("spec").is_valid(spec)
        if schema.valid_by_keys(spec, "spec"):
            assert full, spec
        if full:
            schema.check(spec, "spec")
        else:
            with pytest.raises(ConfigError):
                schema.check(spec, "spec")
    assert schema.valid_by_keys({**BASE, "gpus": 4}, "spec") and schema.keywise("spec")
