"""Text batches: windows that tile the split, inputs and targets one token apart, the same windows
from both loaders, every window of the test split exactly once over the ranks."""

import math

import pytest
import torch

from dpstudy.engine import objective
from dpstudy.engine.loaders import Partition
from dpstudy.engine.token_loader import DeviceTokenLoader, TorchTokenLoader, windows

SEQ = 8
TOKENS = torch.arange(1000, dtype=torch.int32) % 251  # token i is i mod 251: each window is readable


def loader(kind, partition, train=True, batch=5, tokens=TOKENS):
    common = dict(seq_len=SEQ, batch=batch, partition=partition, seed=3, device=torch.device("cpu"), train=train)
    if kind == "torch":
        return TorchTokenLoader(tokens, workers=0, **common)
    return DeviceTokenLoader(tokens, **common)


def test_windows_tile_the_split_one_token_overlapping():
    assert windows(TOKENS, SEQ) == (1000 - 1) // SEQ == 124
    assert windows(TOKENS[:SEQ], SEQ) == 0  # a window needs seq_len + 1 tokens


@pytest.mark.parametrize("kind", ["torch", "device"])
def test_targets_are_the_next_tokens(kind):
    for x, y in loader(kind, Partition(0, 1)):
        assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape and x.shape[1] == SEQ
        assert torch.equal(y[:, :-1], x[:, 1:])
        assert torch.equal(y[:, -1], (x[:, -1] + 1) % 251)  # the token after the input's last


@pytest.mark.parametrize("world", [1, 2, 3])
def test_both_loaders_give_the_same_windows_and_cover_an_epoch(world):
    seen = []
    for rank in range(world):
        batches = {}
        for kind in ("torch", "device"):
            data = loader(kind, Partition(rank, world))
            data.set_epoch(2)
            batches[kind] = list(data)
        assert len(batches["torch"]) == len(batches["device"]) == len(loader("device", Partition(rank, world)))
        for (xt, yt), (xd, yd) in zip(batches["torch"], batches["device"], strict=True):
            assert torch.equal(xt, xd) and torch.equal(yt, yd)
        seen += [int(x[0]) // 1 for xs, _ in batches["device"] for x in xs]
    starts = {i * SEQ % 251 for i in range(124)}
    assert {s % 251 for s in seen} == starts  # every window, padded ranks repeat a few


@pytest.mark.parametrize("kind", ["torch", "device"])
def test_test_split_is_evaluated_once_over_the_ranks(kind):
    firsts = []
    for rank in range(4):
        for x, _ in loader(kind, Partition(rank, 4), train=False):
            firsts += x[:, 0].tolist()
    assert len(firsts) == 124 and sorted(firsts) == sorted(i * SEQ % 251 for i in range(124))


def test_objective_weighs_a_window_as_one_sample():
    torch.manual_seed(0)
    logits, y = torch.randn(3, SEQ, 11), torch.randint(0, 11, (3, SEQ))
    per_token = torch.nn.functional.cross_entropy(logits.reshape(-1, 11), y.reshape(-1), reduction="none")
    assert objective.loss(logits, y) == pytest.approx(per_token.mean().item(), rel=1e-6)
    assert objective.loss_sum(logits, y).item() == pytest.approx(per_token.sum().item() / SEQ, rel=1e-6)
    hits = (logits.argmax(-1) == y).sum().item()
    assert objective.correct(logits, y).item() == pytest.approx(hits / SEQ)
    images, labels = torch.randn(4, 5), torch.tensor([0, 1, 2, 3])
    assert objective.correct(images, labels).item() == (images.argmax(1) == labels).sum().item()
    assert math.isclose(
        objective.loss_sum(images, labels).item(),
        torch.nn.functional.cross_entropy(images, labels, reduction="sum").item(),
        rel_tol=1e-6,
    )
