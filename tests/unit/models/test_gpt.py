"""`gpt` (dpstudy.models.gpt): a GPT-2-style decoder-only language model built for a text Task, its
named sizes and model_args, and the text-model helpers of dpstudy.models (task_kind,
context_length, window)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from dpstudy import models
from dpstudy.data.task import Task
from dpstudy.models.gpt import GPT
from dpstudy.models.gpt_config import ARGS, SIZES
from dpstudy.util.errors import ConfigError

BYTES = Task.text(256, 32)  # a byte tokenizer, windows of 32 tokens


def tiny(task: Task = BYTES, **args) -> GPT:
    torch.manual_seed(0)
    return models.build("gpt", task, args)


def params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_logits_are_batch_by_position_by_vocabulary():
    model = tiny()
    x, y = BYTES.example_batch(3)
    assert model(x).shape == BYTES.output_shape(3) == (3, 32, 256)
    assert model(x[:, :7]).shape == (3, 7, 256)  # shorter than the window: fine
    assert isinstance(model.blocks, nn.ModuleList) and len(model.blocks) == 2  # FSDP: one unit a block
    assert models.MODELS["gpt"].task == "text" and models.MODELS["gpt"].args == ARGS


def test_no_logit_sees_a_later_token():
    model = tiny().eval()
    x, _ = BYTES.example_batch(2)
    before = model(x)
    for t in (0, 13, 31):
        changed = x.clone()
        changed[:, t] = (changed[:, t] + 1) % 256
        after = model(changed)
        torch.testing.assert_close(after[:, :t], before[:, :t], rtol=0, atol=1e-6)
        assert not torch.allclose(after[:, t], before[:, t])


def test_the_output_projection_is_the_token_embedding():
    task = Task.text(97, 16)
    model = tiny(task)
    tables = [p for p in model.parameters() if p.shape == (97, 64)]
    assert len(tables) == 1 and tables[0] is model.wte  # one Parameter, no lm_head of its own
    assert not any(isinstance(m, nn.Linear) and m.out_features == 97 for m in model.modules())
    x, _ = task.example_batch(2)
    model(x).sum().backward()
    assert model.wte.grad is not None
    with torch.no_grad():
        model.wte.zero_()
    assert model(x).abs().max() == 0  # every logit goes through wte


def test_gpt2_size_is_gpt2_small_with_124m_parameters():
    with torch.device("meta"):  # no memory, no initialisation
        model = models.build("gpt", Task.text(50257, 1024), {"size": "gpt2"})
    # GPT-2 small (Radford et al. 2019; Hugging Face's gpt2): 124,439,808 with tied embeddings
    assert params(model) == pytest.approx(124.4e6, rel=0.01)
    assert params(model) == 124_439_808
    config = model.config
    assert (config.n_layer, config.n_head, config.d_model, config.seq_len) == (12, 12, 768, 1024)


@pytest.mark.parametrize("size", SIZES)
def test_every_named_size_builds_on_the_meta_device(size):
    config = SIZES[size]
    with torch.device("meta"):
        model = models.build("gpt", Task.text(256, config.seq_len), {"size": size})
    d, layers = config.d_model, config.n_layer
    block = 12 * d * d + 13 * d  # qkv, proj, fc, proj with their biases, two LayerNorms
    assert params(model) == 256 * d + config.seq_len * d + layers * block + 2 * d


def test_model_args_override_the_size():
    args = {"size": "mini", "n_layer": 3, "d_model": 32, "n_head": 4, "seq_len": 64, "vocab_size": 300, "dropout": 0.1}
    model = tiny(Task.text(256, 64), **args)
    assert len(model.blocks) == 3 and model.blocks[0].attn.heads == 4
    assert model.wte.shape == (300, 32) and model.wpe.shape == (64, 32)
    assert model.config.dropout == 0.1 and model.blocks[0].attn.dropout == 0.1
    assert model(torch.randint(0, 256, (2, 64))).shape == (2, 64, 300)  # the model's vocabulary


@pytest.mark.parametrize(
    "args, message",
    [
        ({"depth": 2}, "model 'gpt' takes no model_args 'depth': it accepts size, n_layer, n_head, d_model, seq_len"),
        ({"size": "huge"}, "model_args size 'huge' is not one of tiny, mini, half, gpt2"),
        ({"n_head": 3}, "d_model 64 is not divisible by n_head 3"),
        ({"n_layer": 0}, "model_args n_layer 0 is not a positive integer"),
        ({"dropout": 1.5}, r"model_args dropout 1.5 is not in \[0, 1\)"),
        ({"vocab_size": 100}, "model 'gpt': the tokenizer has 256 symbols but model_args vocab_size is 100"),
        ({"seq_len": 16}, "model 'gpt': seq_len 32 exceeds its context length 16"),
    ],
)
def test_bad_model_args_are_config_errors_naming_them(args, message):
    with pytest.raises(ConfigError, match=message):
        models.build("gpt", BYTES, args)


def test_a_text_model_refuses_images_and_an_image_model_text():
    with pytest.raises(ConfigError, match="model 'gpt' is for text data; this cell's data is image"):
        models.build("gpt", Task.image(3, 32, 10))
    with pytest.raises(ConfigError, match="model 'lenet' is for image data; this cell's data is text"):
        models.build("lenet", BYTES)


@pytest.mark.parametrize(
    "model, kind",
    [
        ("gpt", "text"),
        ("vit", "image"),
        ("torchvision:resnet18", "image"),
        ("timm:convnext_atto", "image"),
        ("transformers:gpt2", "text"),
        ("nets:make", None),  # a factory: known once built
    ],
)
def test_task_kind(model, kind):
    assert models.task_kind(model) == kind


def test_context_length_and_window():
    assert models.context_length("gpt", {}) == 128  # tiny's
    assert models.context_length("gpt", {"size": "gpt2"}) == 1024
    assert models.context_length("gpt", {"size": "gpt2", "seq_len": 256}) == 256
    assert models.context_length("lenet", {}) is None and models.context_length("nets:make", {}) is None
    assert models.window({"model": "gpt", "model_args": {}, "seq_len": None}) == 128
    assert models.window({"model": "gpt", "model_args": {}, "seq_len": 64}) == 64
    assert models.window({"model": "nets:make", "model_args": {}, "seq_len": 4096}) == 4096  # unknown: trusted
    with pytest.raises(ConfigError, match="model 'gpt': seq_len 256 exceeds its context length 128"):
        models.window({"model": "gpt", "model_args": {}, "seq_len": 256})
    with pytest.raises(ConfigError, match="model 'nets:make' has no known context length: set seq_len"):
        models.window({"model": "nets:make", "model_args": {}, "seq_len": None})


def test_initialisation_is_gpt2s():
    torch.manual_seed(0)
    model = GPT(256, 32, n_layer=8, d_model=256, n_head=4)
    residual = 0.02 / math.sqrt(2 * 8)
    assert model.wte.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.blocks[0].attn.qkv.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.blocks[3].attn.proj.weight.std().item() == pytest.approx(residual, rel=0.05)
    assert model.blocks[3].mlp[2].weight.std().item() == pytest.approx(residual, rel=0.05)
    assert all(b.attn.qkv.bias.abs().sum() == 0 for b in model.blocks)


def test_it_learns_a_batch():
    model = tiny()
    x, y = BYTES.example_batch(4)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(math.log(256), rel=0.05)  # uniform at first
    assert losses[-1] < 0.7 * losses[0]


def test_fsdp_shards_it_with_its_tied_embedding(tmp_path):
    # FSDP2 reshards an nn.Embedding unit after its forward, and a tied head on its weight then
    # meets a DTensor shard: the embeddings are the root's (GPT's docstring). One rank suffices.
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from dpstudy.engine.modes.fsdp import shard_units

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        model, reference = tiny(), tiny()
        assert shard_units(model) == list(model.blocks)
        for unit in shard_units(model):
            fully_shard(unit)
        fully_shard(model)
        x, y = BYTES.example_batch(2)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        torch.testing.assert_close(loss, F.cross_entropy(reference(x).flatten(0, 1), y.flatten()))
    finally:
        dist.destroy_process_group()
