"""Downloading, verifying and reading the torchvision datasets.

URLs and MD5s come from torchvision's own dataset classes (one source of truth); the config may
replace them (`mirror`, `md5`). Files are parsed by torchvision's classes too, subclassed only to
read from our folders and to skip their inner per-file checksums: we verify every downloaded file
against our own, overridable checksum, and the archives the tests generate cannot match
torchvision's lists of inner-file MD5s.
"""

from __future__ import annotations

import http.client
import os
import socket
from pathlib import Path

import torch
from torchvision import datasets as tv
from torchvision.datasets.utils import calculate_md5, download_url, extract_archive

from dpstudy.data.registry import DATASETS, DatasetError, log
from dpstudy.util.errors import ConfigError

TIMEOUT_ENV = "DPSTUDY_DOWNLOAD_TIMEOUT"
DEFAULT_TIMEOUT_S = 30.0


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


def fetch(name: str, files: tuple[str, ...], raw: Path, overrides: dict) -> dict[str, str]:
    """Download every missing file into raw/ and verify it; return {file: md5}.

    A file is moved to its final name only after its checksum matched, so whatever sits in
    raw/ under a real name was verified, and a killed download leaves just a `.part` file.
    """
    md5s = {**official_md5(name), **overrides.get("md5", {})}
    mirrors = [overrides["mirror"]] if "mirror" in overrides else official_mirrors(name)
    raw.mkdir(parents=True, exist_ok=True)
    for file in files:
        if (raw / file).is_file() and calculate_md5(raw / file) == md5s[file]:
            log(name, f"{file}: already downloaded and verified")
            continue
        (raw / file).unlink(missing_ok=True)
        _download_verified(name, file, raw, mirrors, md5s[file])
    return {file: md5s[file] for file in files}


def _download_verified(name: str, file: str, raw: Path, mirrors: list[str], expected: str) -> None:
    part = raw / f".{file}.part"
    _download_any(name, file, part, [m.rstrip("/") + "/" + file for m in mirrors])
    actual = calculate_md5(part)
    if actual != expected:
        part.unlink()  # a retry must download again
        raise DatasetError(
            f"dataset {name!r}: checksum mismatch for {file}: expected md5 {expected}, "
            f"got {actual}; the download was deleted"
        )
    part.rename(raw / file)
    log(name, f"{file}: verified md5 {actual}")


def _download_any(name: str, file: str, part: Path, urls: list[str]) -> None:
    """Download from the first URL that answers; DatasetError naming every URL otherwise."""
    failures = []
    for url in urls:
        part.unlink(missing_ok=True)  # download_url skips a file that already exists
        log(name, f"downloading {file} from {url}")
        try:
            with _socket_timeout(download_timeout()):
                download_url(url, str(part.parent), part.name)
            return
        except (OSError, http.client.HTTPException, RecursionError) as e:
            failures.append(f"{url} ({e})")
    part.unlink(missing_ok=True)
    raise DatasetError(f"dataset {name!r}: cannot download {file} from " + "; ".join(failures))


def download_timeout() -> float:
    text = os.environ.get(TIMEOUT_ENV, "")
    try:
        timeout = float(text) if text else DEFAULT_TIMEOUT_S
    except ValueError:
        timeout = -1.0
    if not timeout > 0:
        raise ConfigError(f"{TIMEOUT_ENV}={text!r} is not a positive number of seconds")
    return timeout


class _socket_timeout:
    """Sets the default socket timeout (urllib offers no other hook through download_url) and
    restores the previous one after, so nothing else in the process inherits it."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __enter__(self) -> None:
        self.previous = socket.getdefaulttimeout()
        socket.setdefaulttimeout(self.seconds)

    def __exit__(self, *exc) -> None:
        socket.setdefaulttimeout(self.previous)


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
