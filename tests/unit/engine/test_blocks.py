"""The blocks FSDP shards and activation checkpointing wraps (dpstudy.engine.blocks): the registry's
models keep the units they had, and a model whose blocks sit deeper gets them found."""

from __future__ import annotations

import pytest
import torch.nn as nn

from dpstudy import models
from dpstudy.data.task import Task
from dpstudy.engine import checkpointing
from dpstudy.engine.blocks import NORM_LAYERS, blocks
from dpstudy.engine.modes.fsdp import shard_units


def units_before(model: nn.Module) -> list[nn.Module]:
    """shard_units as it was before blocks.py: elements of a top-level Sequential or ModuleList,
    else the top-level child, where it holds parameters and is not a normalisation layer."""
    units = []
    for child in model.children():
        parts = list(child) if isinstance(child, (nn.Sequential, nn.ModuleList)) else [child]
        units += [m for m in parts if not isinstance(m, NORM_LAYERS) and any(True for _ in m.parameters())]
    return units


# the registry's models at their sources' image shapes, and how many units FSDP made of each
UNITS = {
    "lenet": (1, 28, 5),
    "resnet18": (3, 32, 10),
    "vgg_bn": (3, 32, 19),
    "vit": (3, 32, 8),
    "simplecnn": (3, 32, 5),
}


@pytest.mark.parametrize("name", sorted(UNITS))
def test_the_registrys_models_keep_their_fsdp_units(name):
    channels, size, count = UNITS[name]
    model = models.build(name, Task.image(channels, size, 10))
    assert [id(m) for m in shard_units(model)] == [id(m) for m in units_before(model)]
    assert len(blocks(model)) == count


class HFBlock(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.ln = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, x):
        return x + self.mlp(self.ln(x))


class HFBody(nn.Module):
    """Like a Hugging Face GPT-2: model.transformer.h, a ModuleList of blocks, below the top level."""

    def __init__(self, width: int = 8, layers: int = 3):
        super().__init__()
        self.wte = nn.Embedding(16, width)
        self.h = nn.ModuleList(HFBlock(width) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)


class HFModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.transformer = HFBody()
        self.lm_head = nn.Linear(8, 16)


class Wrapper(nn.Module):
    """A user's factory around a Hugging Face model: the repeated blocks are two levels down."""

    def __init__(self):
        super().__init__()
        self.model = HFModel()
        self.classifier = nn.Linear(16, 10)


def test_blocks_below_the_top_level_are_found():
    wrapper = Wrapper()
    # the blocks of transformer.h one unit each, not the whole model as one unit; the embedding,
    # the final norm and the head stay with the root, the classifier is a block of its own
    assert blocks(wrapper) == [*wrapper.model.transformer.h, wrapper.classifier]
    assert units_before(wrapper) == [wrapper.model, wrapper.classifier]
    # layers are no repeated blocks (an MLP's Linear layers, even of one class): a composite child
    # without repeated blocks below it stays one block, as before
    mlp = HFBlock(8)
    mlp.mlp = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    model = nn.Module()
    model.body, model.head = mlp, nn.Linear(8, 2)
    assert blocks(model) == units_before(model) == [mlp, model.head]


def test_checkpointing_wraps_the_same_blocks_fsdp_shards():
    wrapper = checkpointing.apply(Wrapper(), "full")
    wrapped = [type(m).__name__ for m in wrapper.model.transformer.h]
    assert wrapped == ["CheckpointWrapper"] * 3
    # the classifier, one Linear layer alone, gains nothing from recomputing: left as it is
    assert isinstance(wrapper.classifier, nn.Linear)
    assert blocks(wrapper) == [*wrapper.model.transformer.h, wrapper.classifier]


def test_a_plain_cnn_is_checkpointed_by_segments_and_fsdp_shards_them():
    # LeNet: conv, ReLU, pool twice; Linear, ReLU twice, then the last Linear alone
    lenet = checkpointing.apply(models.build("lenet", Task.image(1, 28, 10)), "full")
    kinds = [type(m).__name__ for m in (*lenet.features, *lenet.classifier)]
    assert kinds == ["CheckpointWrapper"] * 4 + ["Linear"]
    segments = [[type(m).__name__ for m in wrapper._checkpoint_wrapped_module] for wrapper in lenet.features]
    assert segments == [["Conv2d", "ReLU", "MaxPool2d"]] * 2
    # a unit of FSDP is each segment: as many units as before, one layer with parameters each
    assert len(shard_units(lenet)) == 5
    # ResNet-18: its stem's conv, BatchNorm and ReLU as one, each residual block, the head's Linear not
    resnet = checkpointing.apply(models.build("resnet18", Task.image(3, 16, 10)), "full")
    assert [type(m).__name__ for m in resnet.stem] == ["CheckpointWrapper"]
    assert [type(m).__name__ for m in resnet.stages] == ["CheckpointWrapper"] * 8
    assert isinstance(resnet.head[-1], nn.Linear)
    assert len(shard_units(resnet)) == 10
