"""`transformers:<name>` models (dpstudy.models.external, dpstudy.models.hf): causal language models
of Hugging Face transformers built from their config with random weights, never a download, and a
user's factory of a language model."""

from __future__ import annotations

import builtins
import textwrap

import pytest
import torch
import torch.nn.functional as F

from dpstudy import models
from dpstudy.data.task import Task
from dpstudy.util.errors import ConfigError

pytest.importorskip("transformers")

TEXT = Task.text(300, 16)
SMALL = {
    "transformers:gpt2": {"n_layer": 2, "n_embd": 64, "n_head": 2},
    "transformers:llama": {
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
    },
}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a download would fail


@pytest.mark.parametrize("model", SMALL)
def test_a_small_causal_lm_builds_and_trains_a_step(model):
    torch.manual_seed(0)
    net = models.build(model, TEXT, SMALL[model])
    x, y = TEXT.example_batch(2)
    logits = net(x)
    assert isinstance(logits, torch.Tensor) and logits.shape == TEXT.output_shape(2)  # the task's vocabulary
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
    loss.backward()
    opt.step()
    assert all(torch.isfinite(p).all() for p in net.parameters())
    assert torch.isfinite(F.cross_entropy(net(x).flatten(0, 1), y.flatten()))
    assert net.model.config._attn_implementation == "sdpa"


def test_model_args_override_the_config():
    net = models.build("transformers:gpt2", TEXT, {**SMALL["transformers:gpt2"], "n_positions": 64})
    config = net.model.config
    assert (config.n_layer, config.n_embd, config.n_head, config.n_positions) == (2, 64, 2, 64)
    assert config.vocab_size == 300 and len(net.model.transformer.h) == 2  # the task's vocabulary
    assert config.bos_token_id is None  # gpt2's 50256 is past a 300-symbol vocabulary
    wider = models.build("transformers:gpt2", TEXT, {**SMALL["transformers:gpt2"], "vocab_size": 512})
    assert wider(TEXT.example_batch(1)[0]).shape == (1, 16, 512)
    assert models.context_length("transformers:gpt2", {"n_positions": 64}) == 64
    assert models.context_length("transformers:llama", {"max_position_embeddings": 512}) == 512


@pytest.mark.parametrize(
    "model, args, message",
    [
        ("transformers:gtp2", {}, "transformers has no model type 'gtp2'; close: gpt2"),
        ("transformers:gpt2", {"n_lyer": 2}, r"GPT2Config has no field n_lyer \(close: n_layer"),
        ("transformers:gpt2", {"vocab_size": 100}, "the tokenizer has 300 symbols but model_args vocab_size is 100"),
        ("transformers:gpt2", {"n_positions": 8}, "model 'transformers:gpt2': seq_len 16 exceeds its context length 8"),
    ],
)
def test_a_bad_transformers_model_is_a_config_error(model, args, message):
    with pytest.raises(ConfigError, match=message):
        models.build(model, TEXT, args)


def test_a_missing_transformers_says_which_extra_to_install(monkeypatch):
    real = builtins.__import__

    def no_transformers(name, *args, **kwargs):
        if name == "transformers" or name.startswith("transformers."):
            raise ImportError("No module named 'transformers'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_transformers)
    with pytest.raises(ConfigError, match=r"install the transformers extra \(pip install 'dpstudy\[transformers\]'"):
        models.build("transformers:gpt2", TEXT)


FACTORIES = """
from torch import nn


class Bigram(nn.Module):
    def __init__(self, vocab_size, seq_len, width=8):
        super().__init__()
        self.embed, self.head = nn.Embedding(vocab_size, width), nn.Linear(width, vocab_size)

    def forward(self, ids):
        return self.head(self.embed(ids))


def images_only(num_classes, in_channels, image_size):
    return nn.Linear(in_channels, num_classes)
"""


def test_a_factory_of_a_language_model_gets_the_vocabulary_and_window(tmp_path):
    (tmp_path / "lm.py").write_text(textwrap.dedent(FACTORIES))
    model = models.build("lm:Bigram", TEXT, {"width": 4}, tmp_path)
    assert model.embed.embedding_dim == 4 and model(TEXT.example_batch(2)[0]).shape == (2, 16, 300)
    with pytest.raises(
        ConfigError, match=r"cannot be called with \(vocab_size, seq_len\).*takes vocab_size and seq_len"
    ):
        models.build("lm:images_only", TEXT, None, tmp_path)
    with pytest.raises(ConfigError, match="model_args vocab_size are given by the data"):
        models.build("lm:Bigram", TEXT, {"vocab_size": 512}, tmp_path)


def test_the_usercheck_tries_a_language_model_at_its_window(tmp_path):
    from dpstudy.workflow.usercheck import try_model

    (tmp_path / "lm_check.py").write_text(
        textwrap.dedent(FACTORIES) + "\n\ndef last_only(vocab_size, seq_len):\n"
        "    return nn.Sequential(nn.Embedding(vocab_size, 4), nn.Flatten(), nn.LazyLinear(vocab_size))\n"
    )
    combo = {"model": "gpt", "model_args": {"size": "tiny"}, "code_path": None, "seq_len": None}
    assert try_model(combo, Task.text(256, 1)) is None  # at tiny's context, 128
    wrong = {"model": "lm_check:last_only", "model_args": {}, "code_path": str(tmp_path), "seq_len": 8}
    assert try_model(wrong, Task.text(256, 1)) == (
        "returned (2, 256) for a batch (2, 8); expected (2, 8, 256): one logit per vocabulary symbol per position"
    )
