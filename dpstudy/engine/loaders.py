"""Batches for training and evaluation: `loader: torch` and `loader: device`.

Both partition an epoch the way torch's DistributedSampler does (a permutation seeded by
seed + epoch, rank r takes every world-th index from r), so for the same settings they feed
every rank the same samples; `device` just does it without per-sample Python work.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

Batch = tuple[torch.Tensor, torch.Tensor]

# Source 002's augmentation: RandomAffine(degrees=15, translate=(0.1, 0.1), scale=(0.8, 1.2)).
AFFINE_DEGREES, AFFINE_TRANSLATE, AFFINE_SCALE = 15.0, 0.1, (0.8, 1.2)
CROP_PADDING = 4


@dataclass(frozen=True)
class Partition:
    """A rank's part of a split: every `world`-th sample from `rank` on (the data's partition, not
    FSDP's shard)."""

    rank: int
    world: int


def epoch_indices(n: int, partition: Partition, seed: int, epoch: int) -> torch.Tensor:
    """The indices DistributedSampler(shuffle=True, drop_last=False) gives this rank."""
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    order = torch.randperm(n, generator=g)
    total = math.ceil(n / partition.world) * partition.world
    if total > n:  # DistributedSampler pads with the first indices so every rank steps equally
        order = torch.cat([order, order[: total - n]])
    return order[partition.rank : total : partition.world]


def eval_indices(n: int, partition: Partition) -> torch.Tensor:
    """Disjoint, complete and unpadded: the whole test set is evaluated exactly once."""
    return torch.arange(partition.rank, n, partition.world)


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


def partitioned(
    dataset: Dataset, batch: int, partition: Partition, seed: int, device: torch.device, workers: int, train: bool
) -> tuple[DataLoader, DistributedSampler | None]:
    """A DataLoader over this rank's part of `dataset`: DistributedSampler's shuffled share when
    training (set_epoch reshuffles it), the disjoint unpadded share of eval_indices otherwise."""
    sampler = None
    if train:
        sampler = DistributedSampler(
            dataset, num_replicas=partition.world, rank=partition.rank, shuffle=True, seed=seed
        )
    else:
        dataset = Subset(dataset, eval_indices(len(dataset), partition).tolist())
    generator = torch.Generator()
    generator.manual_seed(seed)  # worker seeds, hence augmentations, follow the run's seed
    loader = DataLoader(
        dataset,
        batch_size=batch,
        sampler=sampler,
        shuffle=False,
        num_workers=workers,
        pin_memory=device.type == "cuda",
        persistent_workers=workers > 0,
        generator=generator,
    )
    return loader, sampler


class TorchLoader:
    """DataLoader + DistributedSampler; batches moved to the device as they are taken."""

    def __init__(
        self,
        images,
        labels,
        *,
        batch: int,
        partition: Partition,
        seed: int,
        augment: str,
        mean,
        std,
        device: torch.device,
        workers: int,
        train: bool,
        channels_last: bool,
    ):
        transform = torchvision_transform(augment if train else "none", mean, std, images.shape[-1])
        dataset = ImageTensorDataset(images, labels, transform)
        self.loader, self.sampler = partitioned(dataset, batch, partition, seed, device, workers, train)
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

# Augmentation on the device draws every sample's parameters for the whole epoch in one call,
# and gathers, augments and normalises a block of batches at once (BLOCK_BYTES of float images),
# so a batch costs a slice, never per-sample Python work. Every step is per sample, so a block
# gives the same values as batch by batch; on a GPU it cuts the ~25 kernel launches each batch
# cost, a large share of a small model's epoch on a fast GPU whose host launches are its bound
# (benchmarks/loader.py).
BLOCK_BYTES = 4 << 20  # small enough to stay in a CPU's cache between preparing and training


def affine_params(n: int, g: torch.Generator, device: torch.device) -> torch.Tensor:
    """[n, 2, 3] inverse affine matrices of RandomAffine(15, translate 0.1, scale 0.8-1.2)."""
    u = torch.rand(n, 4, device=device, generator=g) * 2 - 1  # uniform in [-1, 1]
    angle = torch.deg2rad(u[:, 0] * AFFINE_DEGREES)
    lo, hi = AFFINE_SCALE
    scale = (u[:, 1] + 1) / 2 * (hi - lo) + lo
    # affine_grid coordinates span [-1, 1]: a shift of t * size pixels is 2 * t there.
    tx, ty = u[:, 2] * AFFINE_TRANSLATE * 2, u[:, 3] * AFFINE_TRANSLATE * 2
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    # The grid maps output to input pixels, so it holds the inverse of rotate-scale-translate.
    return torch.stack(
        [
            torch.stack([cos, sin, -(cos * tx + sin * ty)], 1),
            torch.stack([-sin, cos, -(-sin * tx + cos * ty)], 1),
        ],
        1,
    )


def base_grid(h: int, w: int, device: torch.device) -> torch.Tensor:
    """Pixel centres in [-1, 1] (align_corners=False), [h*w, 2] as (x, y)."""
    xs = (torch.arange(w, device=device) * 2 + 1) / w - 1
    ys = (torch.arange(h, device=device) * 2 + 1) / h - 1
    return torch.stack([xs.expand(h, w), ys[:, None].expand(h, w)], -1).reshape(h * w, 2)


def random_affine(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """Apply [n, 2, 3] inverse affine matrices: one grid and one grid_sample for the batch."""
    n, _, h, w = x.shape
    base = base_grid(h, w, x.device)
    # Same grid as F.affine_grid, by broadcasting (several times faster for small images).
    grid = base[None, :, 0:1] * theta[:, None, :, 0] + base[None, :, 1:2] * theta[:, None, :, 1] + theta[:, None, :, 2]
    # Nearest and zero fill, as torchvision's RandomAffine defaults.
    return F.grid_sample(x, grid.view(n, h, w, 2), mode="nearest", padding_mode="zeros", align_corners=False)


def crop_flip_params(n: int, g: torch.Generator, device: torch.device) -> torch.Tensor:
    """[n, 3] integers: crop top, crop left, flip (0/1)."""
    offsets = torch.randint(0, 2 * CROP_PADDING + 1, (n, 2), device=device, generator=g)
    flips = torch.randint(0, 2, (n, 1), device=device, generator=g)
    return torch.cat([offsets, flips], 1)


def random_crop_flip(x: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """RandomCrop(size, padding=4) + RandomHorizontalFlip for a whole batch by one gather."""
    n, c, h, w = x.shape
    dev = x.device
    padded = F.pad(x, (CROP_PADDING,) * 4)
    rows = (params[:, 0:1] + torch.arange(h, device=dev))[:, None, :, None]
    cols = params[:, 1:2] + torch.arange(w, device=dev)
    cols = torch.where(params[:, 2:3].bool(), cols.flip(-1), cols)[:, None, None, :]
    batch = torch.arange(n, device=dev)[:, None, None, None]
    chans = torch.arange(c, device=dev)[None, :, None, None]
    return padded[batch, chans, rows, cols]


# augment -> (draw an epoch's parameters, apply a batch's slice of them)
AUGMENT_ON_DEVICE = {"affine": (affine_params, random_affine), "crop_flip": (crop_flip_params, random_crop_flip)}


class DeviceLoader:
    """The whole split resident on the device as uint8; batches gathered, augmented, normalised there."""

    def __init__(
        self,
        images,
        labels,
        *,
        batch: int,
        partition: Partition,
        seed: int,
        augment: str,
        mean,
        std,
        device: torch.device,
        train: bool,
        channels_last: bool,
    ):
        self.images = images.to(device)
        self.labels = labels.to(device)
        self.batch, self.partition, self.seed, self.train = batch, partition, seed, train
        self.augment = AUGMENT_ON_DEVICE.get(augment) if train else None
        self.mean = torch.tensor(mean, device=device).view(1, -1, 1, 1)
        self.std = torch.tensor(std, device=device).view(1, -1, 1, 1)
        self.device, self.channels_last = device, channels_last
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed * 1009 + partition.rank)  # distinct augmentations per rank
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def indices(self) -> torch.Tensor:
        n = len(self.labels)
        if self.train:
            return epoch_indices(n, self.partition, self.seed, self.epoch)
        return eval_indices(n, self.partition)

    def __len__(self) -> int:
        return math.ceil(len(self.indices()) / self.batch)

    def block_size(self) -> int:
        """Samples prepared at once: whole batches, as many as fit BLOCK_BYTES, at least one."""
        batch_bytes = self.batch * self.images[0].numel() * 4
        return max(1, BLOCK_BYTES // max(1, batch_bytes)) * self.batch

    def prepare(self, rows: torch.Tensor, params: torch.Tensor | None) -> torch.Tensor:
        x = self.images[rows].float().div_(255)
        if self.augment:
            x = self.augment[1](x, params)
        x = (x - self.mean) / self.std
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last else x

    def __iter__(self) -> Iterator[Batch]:
        indices = self.indices().to(self.device)
        params = self.augment[0](len(indices), self.generator, self.device) if self.augment else None
        block = self.block_size()
        for first in range(0, len(indices), block):
            rows = indices[first : first + block]
            x = self.prepare(rows, params[first : first + block] if self.augment else None)
            labels = self.labels[rows]
            for start in range(0, len(rows), self.batch):
                yield x[start : start + self.batch], labels[start : start + self.batch]


def make_loader(kind: str, images, labels, *, workers: int = 0, **kwargs):
    if kind == "torch":
        return TorchLoader(images, labels, workers=workers, **kwargs)
    return DeviceLoader(images, labels, **kwargs)
