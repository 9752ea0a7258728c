"""Batches of a text dataset: windows of seq_len + 1 tokens, the input the first seq_len, the
target the last seq_len (every next token). Window i starts at token i * seq_len, so the windows
tile the split and an epoch sees every token once. `loader: device` keeps the split's tokens on the
device and gathers each batch there; `loader: torch` is a Dataset of windows behind a DataLoader.
Both partition the windows over ranks as dpstudy.engine.loaders does for images (DistributedSampler's
order), so for the same settings they feed every rank the same windows."""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch.utils.data import Dataset

from dpstudy.engine.loaders import Batch, Partition, epoch_indices, eval_indices, partitioned


def windows(tokens: torch.Tensor, seq_len: int) -> int:
    """Samples a split of `tokens` holds."""
    return max(0, (len(tokens) - 1) // seq_len)


class TokenWindows(Dataset):
    def __init__(self, tokens: torch.Tensor, seq_len: int):
        self.tokens, self.seq_len = tokens, seq_len

    def __len__(self) -> int:
        return windows(self.tokens, self.seq_len)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        window = self.tokens[i * self.seq_len : (i + 1) * self.seq_len + 1].long()
        return window[:-1], window[1:]


class TorchTokenLoader:
    """DataLoader + DistributedSampler over the windows; batches moved to the device as taken."""

    def __init__(
        self,
        tokens: torch.Tensor,
        *,
        seq_len: int,
        batch: int,
        partition: Partition,
        seed: int,
        device: torch.device,
        workers: int,
        train: bool,
    ):
        dataset = TokenWindows(tokens, seq_len)
        self.loader, self.sampler = partitioned(dataset, batch, partition, seed, device, workers, train)
        self.device = device

    def set_epoch(self, epoch: int) -> None:
        if self.sampler is not None:
            self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Batch]:
        for x, y in self.loader:
            yield x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)


class DeviceTokenLoader:
    """The split's tokens resident on the device in their stored dtype; a batch is one gather."""

    def __init__(
        self,
        tokens: torch.Tensor,
        *,
        seq_len: int,
        batch: int,
        partition: Partition,
        seed: int,
        device: torch.device,
        train: bool,
    ):
        self.tokens = tokens.to(device)
        self.n = windows(tokens, seq_len)
        self.offsets = torch.arange(seq_len + 1, device=device)
        self.seq_len, self.batch, self.partition, self.seed, self.train = seq_len, batch, partition, seed, train
        self.device, self.epoch = device, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def indices(self) -> torch.Tensor:
        if self.train:
            return epoch_indices(self.n, self.partition, self.seed, self.epoch)
        return eval_indices(self.n, self.partition)

    def __len__(self) -> int:
        return math.ceil(len(self.indices()) / self.batch)

    def __iter__(self) -> Iterator[Batch]:
        indices = self.indices().to(self.device)
        for first in range(0, len(indices), self.batch):
            rows = indices[first : first + self.batch]
            batch = self.tokens[rows[:, None] * self.seq_len + self.offsets].long()
            yield batch[:, :-1], batch[:, 1:]


def make_token_loader(kind: str, tokens: torch.Tensor, *, workers: int = 0, **kwargs):
    if kind == "torch":
        return TorchTokenLoader(tokens, workers=workers, **kwargs)
    return DeviceTokenLoader(tokens, **kwargs)
