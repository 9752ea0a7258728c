"""The torchvision datasets: their official URLs and MD5s, and reading their downloaded files.

URLs and MD5s come from torchvision's own dataset classes (one source of truth); dpstudy.data.fetch
downloads and verifies the files (the config may replace both, `mirror` and `md5`). Files are
parsed by torchvision's classes too, subclassed only to read from our folders and to skip their
inner per-file checksums: we verify every downloaded file against our own, overridable checksum,
and the archives the tests generate cannot match torchvision's lists of inner-file MD5s.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torchvision import datasets as tv
from torchvision.datasets.utils import extract_archive

from dpstudy.data.registry import DATASETS, log


def official_mirrors(name: str) -> list[str]:
    """Base URLs to try in order; a file's URL is base + '/' + file name."""
    if name in ("mnist", "fashion_mnist"):
        return list(_MNIST_CLASSES[name].mirrors)
    return [_ARCHIVE_CLASSES[name].url.rsplit("/", 1)[0]]


def official_md5(name: str) -> dict[str, str]:
    if name in ("mnist", "fashion_mnist"):
        return dict(_MNIST_CLASSES[name].resources)
    cls = _ARCHIVE_CLASSES[name]
    return {cls.filename: cls.tgz_md5}


def read_splits(name: str, raw: Path, workdir: Path) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Extract every raw file into workdir and parse both splits with torchvision."""

    for file in DATASETS[name].files:
        extract_archive(str(raw / file), str(workdir))
    log(name, f"extracted {', '.join(DATASETS[name].files)}")
    return {split: _READERS[name](name, workdir, split == "train") for split in ("train", "test")}


class _RawFolder:
    """torchvision's MNIST reads root/<ClassName>/raw; ours are the extracted files in root."""

    @property
    def raw_folder(self) -> str:
        return str(self.root)

    @property
    def processed_folder(self) -> str:  # the legacy .pt cache torchvision would look for: never there
        return os.path.join(self.root, "no-legacy-cache")


class _MNIST(_RawFolder, tv.MNIST):
    pass


class _FashionMNIST(_RawFolder, tv.FashionMNIST):
    pass


class _CIFAR10(tv.CIFAR10):
    meta = {**tv.CIFAR10.meta, "md5": None}  # batches.meta: existence only, see module docstring

    def _check_integrity(self) -> bool:
        return True


class _STL10(tv.STL10):
    def _check_integrity(self) -> bool:
        return True


_MNIST_CLASSES = {"mnist": tv.MNIST, "fashion_mnist": tv.FashionMNIST}
_MNIST_READERS = {"mnist": _MNIST, "fashion_mnist": _FashionMNIST}
_ARCHIVE_CLASSES = {"cifar10": tv.CIFAR10, "stl10": tv.STL10}


def _mnist_split(name: str, folder: Path, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
    ds = _MNIST_READERS[name](str(folder), train=train)
    return ds.data.unsqueeze(1).contiguous(), ds.targets.to(torch.int64)


def _cifar_split(name: str, folder: Path, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
    ds = _CIFAR10(str(folder), train=train)
    images = torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous()  # torchvision keeps HWC
    return images, torch.tensor(ds.targets, dtype=torch.int64)


def _stl_split(name: str, folder: Path, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
    ds = _STL10(str(folder), split="train" if train else "test")
    return torch.from_numpy(ds.data).contiguous(), torch.from_numpy(ds.labels).to(torch.int64)


_READERS = {"mnist": _mnist_split, "fashion_mnist": _mnist_split, "cifar10": _cifar_split, "stl10": _stl_split}
