"""Models outside the registry (dpstudy.models, dpstudy.models.external): torchvision and timm
classification models with random weights, and a user's factory, each made for the dataset."""

from __future__ import annotations

import textwrap

import pytest
import torch

from dpstudy import models
from dpstudy.data.task import Task
from dpstudy.util import refs
from dpstudy.util.errors import ConfigError

FACTORIES = """
from torch import nn


def tiny(num_classes, in_channels, image_size, width=4):
    return nn.Sequential(nn.Conv2d(in_channels, width, 3), nn.Flatten(), nn.LazyLinear(num_classes))


def positional(classes, channels):
    return nn.Linear(channels, classes)


def not_a_model(num_classes, in_channels, image_size):
    return "a string"


NOT_CALLABLE = 3
"""


@pytest.fixture
def code(tmp_path):
    (tmp_path / "nets.py").write_text(textwrap.dedent(FACTORIES))
    return tmp_path


def logits(model, channels, size):
    model.eval()
    with torch.no_grad():
        return model(torch.zeros(2, channels, size, size))


@pytest.mark.parametrize(
    "model, kind, token",
    [
        ("lenet", "registry", "lenet"),
        ("torchvision:resnet18", "torchvision", "torchvision_resnet18"),
        ("timm:convnext_atto", "timm", "timm_convnext_atto"),
        ("timm:vit_tiny_patch16_224.augreg_in21k", "timm", "timm_vit_tiny_patch16_224_augreg_in21k"),
        ("my_pkg.nets:TinyNet", "factory", "tinynet_" + refs.token("my_pkg.nets:TinyNet").split("_")[-1]),
    ],
)
def test_every_kind_of_model_has_a_readable_token(model, kind, token):
    assert models.kind(model) == kind and models.token(model) == token
    assert models.token(model) == models.token(model)  # stable


def test_two_factories_of_one_name_get_two_tokens():
    assert models.token("a:make") != models.token("b:make")
    assert models.token("a:make").startswith("make_") and len(models.token("a:make")) == len("make_") + 6


@pytest.mark.parametrize("model", ["gpt9", "torchvision:", "timm:a b", "nets:", "a b:c", "nets:1x"])
def test_an_unknown_model_is_a_config_error_naming_the_choices(model):
    with pytest.raises(ConfigError, match="timm:<name>, transformers:<name> or a factory <module>:<callable>"):
        models.kind(model)


def test_a_torchvision_model_takes_the_datasets_channels_and_classes():
    model = models.build("torchvision:resnet18", Task.image(1, 28, 7))
    assert model.conv1.in_channels == 1 and model.conv1.out_channels == 64 and model.conv1.stride == (2, 2)
    assert logits(model, 1, 28).shape == (2, 7)
    rgb = models.build("torchvision:resnet18", Task.image(3, 32, 10))
    assert sum(p.numel() for p in rgb.parameters()) == 11_181_642  # torchvision's ResNet-18 at 10 classes


def test_model_args_reach_a_torchvision_constructor():
    narrow = models.build("torchvision:mobilenet_v3_small", Task.image(3, 32, 5), {"width_mult": 0.5})
    wide = models.build("torchvision:mobilenet_v3_small", Task.image(3, 32, 5))
    assert sum(p.numel() for p in narrow.parameters()) < sum(p.numel() for p in wide.parameters()) / 2
    assert logits(narrow, 3, 32).shape == (2, 5)


@pytest.mark.parametrize(
    "model, args, message",
    [
        ("torchvision:resnet1", {}, "torchvision has no classification model 'resnet1'; it has alexnet"),
        ("torchvision:fasterrcnn_resnet50_fpn", {}, "no classification model 'fasterrcnn_resnet50_fpn'"),
        ("torchvision:resnet18", {"depth": 3}, r"torchvision:resnet18 with model_args \{'depth': 3\}"),
        ("timm:resnet_does_not_exist", {}, "timm has no model 'resnet_does_not_exist'"),
        ("lenet", {"width": 2}, "model 'lenet' takes no model_args 'width': it accepts none"),
    ],
)
def test_a_model_that_cannot_be_built_is_a_config_error(model, args, message):
    with pytest.raises(ConfigError, match=message):
        models.build(model, Task.image(3, 32, 10), args)


def test_a_timm_model_is_made_for_the_dataset_without_a_download(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a download would fail
    model = models.build("timm:test_resnet", Task.image(1, 28, 4))
    assert logits(model, 1, 28).shape == (2, 4)
    assert next(m for m in model.modules() if isinstance(m, torch.nn.Conv2d)).in_channels == 1


def test_a_factory_is_called_with_the_dataset_and_its_model_args(code):
    model = models.build("nets:tiny", Task.image(3, 8, 5), {"width": 6}, code)
    assert model[0].out_channels == 6 and logits(model, 3, 8).shape == (2, 5)
    assert models.source_file("nets:tiny", code) == code / "nets.py"
    assert models.source_file("torchvision:resnet18", code) is None


@pytest.mark.parametrize(
    "model, message",
    [
        ("nets:positional", r"factory nets:positional\(classes, channels\) cannot be called with \(num_classes, "),
        ("nets:not_a_model", "model 'nets:not_a_model' gave a str, not a torch.nn.Module"),
        ("nets:NOT_CALLABLE", r"module 'nets' \(.*nets\.py\) has no callable 'NOT_CALLABLE'"),
        ("other_nets:tiny", r"cannot import module 'other_nets' \(looked in .* and on the Python path\)"),
    ],
)
def test_a_bad_factory_is_one_error_naming_it(code, model, message):
    with pytest.raises(ConfigError, match=message):
        models.build(model, Task.image(3, 8, 5), None, code)


def test_an_unknown_keyword_of_a_factory_is_named(code):
    with pytest.raises(ConfigError, match=r"cannot be called with \(num_classes, in_channels, image_size, depth\)"):
        models.build("nets:tiny", Task.image(3, 8, 5), {"depth": 2}, code)
