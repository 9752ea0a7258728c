"""activation_checkpointing (dpstudy.engine.checkpointing): the same losses, gradients and BatchNorm
statistics as without it, less kept for backward (the tracker's activations, dpstudy.engine.memory),
and the memory plan predicts it (dpstudy.workflow.memory_plan)."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from dpstudy import models
from dpstudy.data.store import shape_and_classes
from dpstudy.data.task import Task
from dpstudy.engine import checkpointing, memory
from dpstudy.engine.modes import MODES, mode_for
from dpstudy.engine.train import Trainer
from dpstudy.study.spec import complete

HOW = ("none", "full", "selective")


class Attention(nn.Module):
    def __init__(self, width: int, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """A pre-norm transformer block, dropout included (recomputing must draw the same mask)."""

    def __init__(self, width: int, dropout: float):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = Attention(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width), nn.Dropout(dropout)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyTransformer(nn.Module):
    """8x8 images as 16 patches of 2x2 pixels, two blocks in a ModuleList."""

    def __init__(self, width: int = 32, classes: int = 10, dropout: float = 0.1):
        super().__init__()
        self.embed = nn.Linear(3 * 4, width)
        self.blocks = nn.ModuleList(Block(width, dropout) for _ in range(2))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        patches = F.unfold(x, kernel_size=2, stride=2).transpose(1, 2)  # [B, 16, 12]
        h = self.embed(patches)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h).mean(1))


MODELS = {
    "tiny_transformer": (TinyTransformer, (32, 3, 8, 8)),
    # compiled, dropout draws from the compiler's own random numbers: none to compare eager with
    "without_dropout": (lambda: TinyTransformer(dropout=0.0), (32, 3, 8, 8)),
    "resnet18": (lambda: models.build("resnet18", Task.image(3, 16, 10)), (8, 3, 16, 16)),
}


def spec_of(**settings) -> dict:
    return complete({"dataset": "synthetic", "model": "lenet", "mode": "single", "lr": 0.05, **settings})


def two_steps(name: str, how: str, compiled: bool = False) -> dict:
    """Two Trainer steps of a model from seed 0 checkpointed `how`, the second under the tracker
    (eager only): its losses, gradients, buffers and the tracker's activations (MB)."""
    build, shape = MODELS[name]
    generator = torch.Generator().manual_seed(2)
    x, y = torch.randn(*shape, generator=generator), torch.randint(0, 10, (shape[0],), generator=generator)
    torch.manual_seed(0)
    mode = MODES["single"](torch.device("cpu"), checkpointing=how)
    trainer = Trainer(spec_of(compile=compiled), mode, None, None, build(), log=lambda _: None)
    torch.manual_seed(1)  # the same dropout masks in every run
    losses = [trainer.step(x, y)[0].item() / len(y)]

    def step():
        losses.append(trainer.step(x, y)[0].item() / len(y))

    parts = {"activations": None}
    if compiled:
        step()
    else:
        (parts,) = memory.tracked_step(trainer.model, trainer.optimizer, step).values()
    return {
        "losses": losses,
        "grads": torch.cat([p.grad.flatten() for p in trainer.model.parameters()]),
        "buffers": [b.clone() for b in trainer.model.buffers()],
        "activations": parts["activations"],
    }


@pytest.fixture(scope="module")
def runs() -> dict:
    return {(name, how): two_steps(name, how) for name in ("tiny_transformer", "resnet18") for how in HOW}


@pytest.mark.parametrize("name", ["resnet18", "tiny_transformer"])
@pytest.mark.parametrize("how", ["full", "selective"])
def test_checkpointing_changes_no_loss_gradient_nor_batchnorm_statistic(runs, name, how):
    plain, checkpointed = runs[(name, "none")], runs[(name, how)]
    assert checkpointed["losses"] == pytest.approx(plain["losses"], rel=1e-5)
    difference = (checkpointed["grads"] - plain["grads"]).norm() / plain["grads"].norm()
    assert difference < 1e-5
    # BatchNorm's running statistics and batch counts (ResNet-18's), updated once a step as without
    for ours, theirs in zip(checkpointed["buffers"], plain["buffers"], strict=True):
        assert torch.equal(ours, theirs)


@pytest.mark.parametrize("name", ["resnet18", "tiny_transformer"])
def test_checkpointing_keeps_less_for_backward(runs, name):
    # full keeps each block's input, selective its products' outputs too, none everything
    mb = {how: runs[(name, how)]["activations"] for how in HOW}
    assert mb["full"] < mb["selective"] < mb["none"], mb


def test_selective_keeps_what_products_and_convolutions_make():
    from torch.utils.checkpoint import CheckpointPolicy

    aten = torch.ops.aten
    for op in (aten.mm.default, aten.addmm.default, aten.bmm.default, aten.convolution.default):
        assert checkpointing.keep_products(None, op) == CheckpointPolicy.MUST_SAVE
    assert aten._scaled_dot_product_flash_attention_for_cpu.default in checkpointing.SAVED_OPS
    for op in (aten.relu.default, aten.native_batch_norm.default, aten.gelu.default):
        assert checkpointing.keep_products(None, op) == CheckpointPolicy.PREFER_RECOMPUTE


def test_every_mode_takes_the_setting_and_checkpoints_first():
    assert mode_for(spec_of(activation_checkpointing="full"), env={}).checkpointing == "full"
    assert mode_for(spec_of(), env={}).checkpointing == "none"  # null: none
    for name in ("single", "dp"):  # ddp and fsdp: test_hsdp.py, on ranks
        model = MODES[name](torch.device("cpu"), checkpointing="selective").prepare(TinyTransformer(), None, False)
        inner = model.module if name == "dp" else model
        assert [type(b).__name__ for b in inner.blocks] == ["CheckpointWrapper"] * 2
    with pytest.raises(ValueError, match="activation_checkpointing 'some'"):
        checkpointing.apply(TinyTransformer(), "some")


def test_the_memory_plan_predicts_the_activations_checkpointing_keeps(tmp_path):
    """The plan's fake step against the tracker on a real step of the same cell (ResNet-18 on the
    generated `synthetic`, batch 8): within 15 %, and less with checkpointing than without."""
    from dpstudy.workflow import memory_plan

    shape, classes = shape_and_classes("synthetic", tmp_path)
    predicted, measured = {}, {}
    for how in HOW:
        spec = complete(
            {"dataset": "synthetic", "model": "resnet18", "mode": "single", "batch": 8, "data_root": str(tmp_path)}
            | ({"activation_checkpointing": how} if how != "none" else {})
        )
        predicted[how] = memory_plan.predict(spec)["activations_mb"][0]
        torch.manual_seed(0)
        model = models.build("resnet18", Task.image(shape[0], shape[1], len(classes)))
        trainer = Trainer(spec, MODES["single"](torch.device("cpu"), checkpointing=how), None, None, model, log=print)
        x, y = torch.randn(8, *shape), torch.randint(0, len(classes), (8,))
        trainer.step(x, y)  # as after training: the optimizer's state exists
        (parts,) = memory.tracked_step(trainer.model, trainer.optimizer, functools.partial(trainer.step, x, y)).values()
        measured[how] = parts["activations"]
    for how in HOW:
        assert abs(predicted[how] / measured[how] - 1) <= 0.15, (how, predicted, measured)
    assert predicted["full"] < predicted["selective"] < predicted["none"], predicted


@pytest.mark.slow
@pytest.mark.parametrize("how", ["full", "selective"])
def test_compiled_checkpointing_takes_the_eager_steps(how):
    # under torch.compile the compiler recomputes in its backward graph: no context but selective's
    torch._dynamo.reset()
    compiled, eager = two_steps("without_dropout", how, compiled=True), two_steps("without_dropout", how)
    assert compiled["losses"] == pytest.approx(eager["losses"], rel=1e-4)
    difference = (compiled["grads"] - eager["grads"]).norm() / eager["grads"].norm()
    assert difference < 1e-4
