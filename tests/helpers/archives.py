"""Tiny fake dataset archives in the real formats, for testing downloads without the internet.

Each writer puts the files of one dataset (the names torchvision downloads) into a folder and
returns the source data {"train": (uint8 [N,C,H,W], int64 [N]), "test": ...} that a correct
reader must reproduce exactly.
"""

from __future__ import annotations

import gzip
import io
import pickle
import struct
import tarfile
from pathlib import Path

import numpy as np
import torch

Splits = dict[str, tuple[torch.Tensor, torch.Tensor]]
CIFAR_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
STL_CLASSES = ["airplane", "bird", "car", "cat", "deer", "dog", "horse", "monkey", "ship", "truck"]


def random_splits(channels: int, size: int, n_train: int, n_test: int, seed: int = 0) -> Splits:
    g = torch.Generator().manual_seed(seed)

    def split(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        images = torch.randint(0, 256, (n, channels, size, size), generator=g, dtype=torch.uint8)
        return images, torch.randint(0, 10, (n,), generator=g)

    return {"train": split(n_train), "test": split(n_test)}


def _idx(magic_type: int, array: np.ndarray) -> bytes:
    """The big-endian IDX format of MNIST: 0, 0, type code, number of dims, dims, data."""
    header = struct.pack(">BBBB", 0, 0, magic_type, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_mnist(folder: Path, n_train: int = 60, n_test: int = 20) -> Splits:
    """The four gzipped IDX files of MNIST (and Fashion-MNIST, which shares names and format)."""
    data = random_splits(1, 28, n_train, n_test)
    for prefix, split in (("train", "train"), ("t10k", "test")):
        images, labels = data[split]
        for kind, payload in (
            ("images-idx3", _idx(0x08, images[:, 0].numpy())),
            ("labels-idx1", _idx(0x08, labels.numpy())),
        ):
            (folder / f"{prefix}-{kind}-ubyte.gz").write_bytes(gzip.compress(payload, mtime=0))
    return data


def _tar_gz(path: Path, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, payload in members.items():
            entry = tarfile.TarInfo(name)
            entry.size = len(payload)
            tar.addfile(entry, io.BytesIO(payload))


def write_cifar10(folder: Path, per_batch: int = 4, n_test: int = 10) -> Splits:
    """cifar-10-python.tar.gz: five pickled train batches, a test batch and batches.meta, each
    batch {"data": uint8 [n, 3072] (R, G, B planes), "labels": [int]}."""
    data = random_splits(3, 32, 5 * per_batch, n_test)

    def batch(images: torch.Tensor, labels: torch.Tensor) -> bytes:
        return pickle.dumps({"data": images.reshape(len(images), -1).numpy(), "labels": labels.tolist()})

    train_images, train_labels = data["train"]
    members = {
        f"cifar-10-batches-py/data_batch_{i + 1}": batch(
            train_images[i * per_batch : (i + 1) * per_batch], train_labels[i * per_batch : (i + 1) * per_batch]
        )
        for i in range(5)
    }
    members["cifar-10-batches-py/test_batch"] = batch(*data["test"])
    members["cifar-10-batches-py/batches.meta"] = pickle.dumps({"label_names": CIFAR_CLASSES})
    _tar_gz(folder / "cifar-10-python.tar.gz", members)
    return data


def write_stl10(folder: Path, n_train: int = 10, n_test: int = 10) -> Splits:
    """stl10_binary.tar.gz: {train,test}_X.bin (uint8 images, each plane stored column-major)
    and {train,test}_y.bin (labels 1..10)."""
    data = random_splits(3, 96, n_train, n_test)
    members = {"stl10_binary/class_names.txt": "\n".join(STL_CLASSES).encode()}
    for split, (images, labels) in data.items():
        members[f"stl10_binary/{split}_X.bin"] = images.transpose(2, 3).contiguous().numpy().tobytes()
        members[f"stl10_binary/{split}_y.bin"] = (labels + 1).to(torch.uint8).numpy().tobytes()
    _tar_gz(folder / "stl10_binary.tar.gz", members)
    return data


WRITERS = {"mnist": write_mnist, "fashion_mnist": write_mnist, "cifar10": write_cifar10, "stl10": write_stl10}
