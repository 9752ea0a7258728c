"""Training FLOPs per sample (dpstudy.models.flops), counted on the meta device, against the
analytic counts of a transformer language model and ResNet-18's published multiply-adds."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

from dpstudy import models
from dpstudy.data.task import Task
from dpstudy.models import flops
from dpstudy.models.gpt_config import resolve


def gpt(task: Task, args: dict):
    return lambda: models.build("gpt", task, args)


def analytic_per_token(task: Task, args: dict) -> tuple[int, int]:
    """(6N + 12 L d T, N) from the config alone (Kaplan et al. 2020, with the attention term of
    Chinchilla's appendix F): N = the weights of the matrix products, 12 d^2 a block (qkv 3 d^2,
    projection d^2, MLP 4 d^2 + 4 d^2) plus the output projection V d; no biases, norms or
    embedding lookups. Training = 3 x forward: backward computes the gradient of the input and of
    the weight of every product. T x T attention scores count whole, causal mask or not."""
    config = resolve(args)
    vocab = config.vocab_size or task.vocab_size
    d, layers, t = config.d_model, config.n_layer, task.seq_len
    n = 12 * layers * d * d + vocab * d
    return 6 * n + 12 * layers * d * t, n


@pytest.mark.parametrize(
    "task, args",
    [
        (Task.text(256, 128), {}),  # tiny: attention is a fifth of the count
        (Task.text(1000, 64), {"n_layer": 3, "d_model": 96, "n_head": 3, "seq_len": 64}),
        (Task.text(50257, 1024), {"size": "gpt2"}),  # GPT-2 small, on the meta device in a second
    ],
)
def test_gpt_counts_6n_plus_attention_per_token(task, args):
    counted = flops.train_flops_per_sample(gpt(task, args), task) / task.seq_len
    expected, n = analytic_per_token(task, args)
    print(f"{args or 'tiny'}: N {n:,}, counted {counted:,.0f} / token, analytic {expected:,}, {counted / expected:.4f}")
    assert counted == pytest.approx(expected, rel=0.05)


def test_resnet18_forward_is_its_published_multiply_adds():
    # torchvision's ResNet-18 at 224 x 224, 1000 classes: 1.82 G multiply-adds (He et al. 2016, table 1;
    # torchvision's model card: 1.81 GFLOPS, counted as multiply-adds)
    task = Task.image(3, 224, 1000)
    with torch.device("meta"):
        model = models.build("torchvision:resnet18", task)
    counter = FlopCounterMode(display=False)
    with counter:
        model(task.example_batch(2, "meta")[0])
    forward = counter.get_total_flops() / 2
    assert forward / 2 == pytest.approx(1.82e9, rel=0.03)
    train = flops.train_flops_per_sample(lambda: models.build("torchvision:resnet18", task), task)
    # backward is twice forward, less the first convolution's input gradient (the images need none)
    assert 2.9 * forward < train < 3 * forward


@pytest.mark.parametrize(
    "model, task",
    [("gpt", Task.text(256, 128)), ("resnet18", Task.image(3, 32, 10)), ("vit", Task.image(3, 32, 10))],
)
def test_the_count_per_sample_does_not_depend_on_the_batch(model, task):
    def build():
        return models.build(model, task)

    assert len({flops.train_flops_per_sample(build, task, batch=b) for b in (2, 3, 8)}) == 1


def test_prepare_counts_what_checkpointing_recomputes():
    task, args = Task.text(256, 128), {}

    class Checkpointed(nn.Module):
        def __init__(self, block):
            super().__init__()
            self.block = block

        def forward(self, x):
            return checkpoint(self.block, x, use_reentrant=False)

    def prepare(model):
        model.blocks = nn.ModuleList(Checkpointed(b) for b in model.blocks)
        return model

    plain = flops.train_flops_per_sample(gpt(task, args), task)
    recomputed = flops.train_flops_per_sample(gpt(task, args), task, prepare=prepare)
    d, layers, t = 64, 2, task.seq_len
    # the blocks' forward once more, but for the MLP's output projection (4 d^2 a token): checkpoint
    # stops recomputing once it has every tensor backward needs, and that product's output is none
    recompute = layers * (2 * (12 - 4) * d * d * t + 4 * d * t * t)
    assert recomputed - plain == recompute


def test_cost_is_parameters_and_flops():
    task = Task.text(256, 128)
    cost = models.cost("gpt", task)
    assert cost["params"] == 124_672  # tiny at 256 symbols; built on the meta device
    assert cost["train_flops_per_sample"] == flops.train_flops_per_sample(gpt(task, {}), task)


class ReadsAValue(nn.Module):
    """Control flow on a value: the meta device (and fake tensors) have none."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.linear = nn.Linear(3 * 8 * 8, classes)

    def forward(self, x):
        x = x.flatten(1)
        return self.linear(x * 2 if x.mean().item() > 0 else x)


def test_a_model_the_meta_device_cannot_run_is_a_clear_error():
    task = Task.image(3, 8, 10)
    with pytest.raises(flops.FlopCountError, match="cannot count FLOPs on the meta device: RuntimeError: .*item"):
        flops.train_flops_per_sample(ReadsAValue, task)


def test_transformers_models_are_counted_as_gpt_is():
    # transformers' masks read values back on the meta device; the count steps on fake tensors
    pytest.importorskip("transformers")
    task = Task.text(1000, 64)
    hf = models.cost("transformers:gpt2", task, {"n_layer": 2, "n_embd": 64, "n_head": 2})
    ours = models.cost("gpt", task, {"n_layer": 2, "d_model": 64, "n_head": 2})
    assert hf["train_flops_per_sample"] == ours["train_flops_per_sample"]  # the same matrix products
    assert hf["params"] == ours["params"] + (1024 - 128) * 64  # gpt2's longer position table
