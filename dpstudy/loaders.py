"""Batches for training and evaluation: `loader: torch` and `loader: device`.

Both shard an epoch the way torch's DistributedSampler does (a permutation seeded by
seed + epoch, rank r takes every world-th index from r), so for the same settings they feed
every rank the same samples; `device` just does it without per-sample Python work.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

Batch = tuple[torch.Tensor, torch.Tensor]

# Source 002's augmentation: RandomAffine(degrees=15, translate=(0.1, 0.1), scale=(0.8, 1.2)).
AFFINE_DEGREES, AFFINE_TRANSLATE, AFFINE_SCALE = 15.0, 0.1, (0.8, 1.2)
CROP_PADDING = 4


@dataclass(frozen=True)
class Shard:
    rank: int
    world: int


def epoch_indices(n: int, shard: Shard, seed: int, epoch: int) -> torch.Tensor:
    """The indices DistributedSampler(shuffle=True, drop_last=False) gives this rank."""
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    order = torch.randperm(n, generator=g)
    total = math.ceil(n / shard.world) * shard.world
    if total > n:  # DistributedSampler pads with the first indices so every rank steps equally
        order = torch.cat([order, order[: total - n]])
    return order[shard.rank : total : shard.world]


def eval_indices(n: int, shard: Shard) -> torch.Tensor:
    """Disjoint, complete and unpadded: the whole test set is evaluated exactly once."""
    return torch.arange(shard.rank, n, shard.world)


# ---- loader: torch ---------------------------------------------------------------------------

class ImageTensorDataset(Dataset):
    """A torchvision-style dataset over a uint8 [N,C,H,W] tensor with a per-sample transform."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, transform):
        self.images, self.labels, self.transform = images, labels, transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return self.transform(self.images[i]), self.labels[i]


def torchvision_transform(augment: str, mean: list[float], std: list[float], size: int):
    from torchvision.transforms import v2

    steps = {
        "none": [],
        "affine": [v2.RandomAffine(AFFINE_DEGREES, translate=(AFFINE_TRANSLATE,) * 2, scale=AFFINE_SCALE)],
        "crop_flip": [v2.RandomCrop(size, padding=CROP_PADDING), v2.RandomHorizontalFlip()],
    }[augment]
    return v2.Compose([*steps, v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)])


class TorchLoader:
    """DataLoader + DistributedSampler; batches moved to the device as they are taken."""

    def __init__(self, images, labels, *, batch: int, shard: Shard, seed: int, augment: str,
                 mean, std, device: torch.device, workers: int, train: bool, channels_last: bool):
        transform = torchvision_transform(augment if train else "none", mean, std, images.shape[-1])
        dataset = ImageTensorDataset(images, labels, transform)
        self.sampler = None
        if train:
            self.sampler = DistributedSampler(dataset, num_replicas=shard.world, rank=shard.rank,
                                              shuffle=True, seed=seed)
        else:
            dataset = Subset(dataset, eval_indices(len(labels), shard).tolist())
        generator = torch.Generator()
        generator.manual_seed(seed)  # worker seeds, hence augmentations, follow the run's seed
        self.loader = DataLoader(
            dataset, batch_size=batch, sampler=self.sampler, shuffle=False, num_workers=workers,
            pin_memory=device.type == "cuda", persistent_workers=workers > 0, generator=generator,
        )
        self.device, self.channels_last = device, channels_last

    def set_epoch(self, epoch: int) -> None:
        if self.sampler is not None:
            self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Batch]:
        for x, y in self.loader:
            x = x.to(self.device, non_blocking=True)
            if self.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            yield x, y.to(self.device, non_blocking=True)


# ---- loader: device --------------------------------------------------------------------------

def random_affine(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """RandomAffine(15, translate 0.1, scale 0.8-1.2) for a whole batch: one grid_sample call."""
    n, dev = x.shape[0], x.device
    uniform = lambda lo, hi: torch.rand(n, device=dev, generator=g) * (hi - lo) + lo  # noqa: E731
    angle = torch.deg2rad(uniform(-AFFINE_DEGREES, AFFINE_DEGREES))
    scale = uniform(*AFFINE_SCALE)
    # affine_grid works in [-1, 1] coordinates: a shift of t * size pixels is 2 * t there.
    tx, ty = uniform(-AFFINE_TRANSLATE, AFFINE_TRANSLATE) * 2, uniform(-AFFINE_TRANSLATE, AFFINE_TRANSLATE) * 2
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    # The grid maps output to input pixels, so it holds the inverse of rotate-scale-translate.
    theta = torch.stack([
        torch.stack([cos, sin, -(cos * tx + sin * ty)], 1),
        torch.stack([-sin, cos, -(-sin * tx + cos * ty)], 1),
    ], 1)
    grid = F.affine_grid(theta.to(x.dtype), list(x.shape), align_corners=False)
    # Nearest and zero fill, as torchvision's RandomAffine defaults.
    return F.grid_sample(x, grid, mode="nearest", padding_mode="zeros", align_corners=False)


def random_crop_flip(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """RandomCrop(size, padding=4) + RandomHorizontalFlip for a whole batch by gather."""
    n, _, h, w = x.shape
    p, dev = CROP_PADDING, x.device
    padded = F.pad(x, (p, p, p, p))
    top = torch.randint(0, 2 * p + 1, (n,), device=dev, generator=g)
    left = torch.randint(0, 2 * p + 1, (n,), device=dev, generator=g)
    rows = (top[:, None] + torch.arange(h, device=dev))[:, None, :, None]
    cols = (left[:, None] + torch.arange(w, device=dev))[:, None, None, :]
    flip = torch.rand(n, device=dev, generator=g) < 0.5
    cols = torch.where(flip[:, None, None, None], cols.flip(-1), cols)
    batch = torch.arange(n, device=dev)[:, None, None, None]
    chans = torch.arange(x.shape[1], device=dev)[None, :, None, None]
    return padded[batch, chans, rows, cols]


AUGMENT_ON_DEVICE = {"none": lambda x, g: x, "affine": random_affine, "crop_flip": random_crop_flip}


class DeviceLoader:
    """The whole split resident on the device as uint8; batches gathered, augmented, normalised there."""

    def __init__(self, images, labels, *, batch: int, shard: Shard, seed: int, augment: str,
                 mean, std, device: torch.device, train: bool, channels_last: bool):
        self.images = images.to(device)
        self.labels = labels.to(device)
        self.batch, self.shard, self.seed, self.train = batch, shard, seed, train
        self.augment = AUGMENT_ON_DEVICE[augment if train else "none"]
        self.mean = torch.tensor(mean, device=device).view(1, -1, 1, 1)
        self.std = torch.tensor(std, device=device).view(1, -1, 1, 1)
        self.device, self.channels_last = device, channels_last
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed * 1009 + shard.rank)  # distinct augmentations per rank
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def indices(self) -> torch.Tensor:
        n = len(self.labels)
        if self.train:
            return epoch_indices(n, self.shard, self.seed, self.epoch)
        return eval_indices(n, self.shard)

    def __len__(self) -> int:
        return math.ceil(len(self.indices()) / self.batch)

    def __iter__(self) -> Iterator[Batch]:
        for chunk in self.indices().to(self.device).split(self.batch):
            x = self.images[chunk].float().div_(255)
            x = (self.augment(x, self.generator) - self.mean) / self.std
            if self.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            yield x, self.labels[chunk]


def make_loader(kind: str, images, labels, *, workers: int = 0, **kwargs):
    if kind == "torch":
        return TorchLoader(images, labels, workers=workers, **kwargs)
    return DeviceLoader(images, labels, **kwargs)
