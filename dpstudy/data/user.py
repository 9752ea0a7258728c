"""A user's own data, prepared once into the same resident format as the registry's datasets
(train.pt, test.pt, meta.json; dpstudy.data.store):

  imagefolder          a torchvision ImageFolder tree (one folder per class) at `path`, its test
                       split from `test_path` (the same classes) or `test_fraction` of every class
                       (default 0.2, a seeded choice); every image converted to `channels` (3: RGB,
                       1: grayscale), resized so its shorter side is `image_size`, centre-cropped
  <module>:<callable>  a function of the user's, called with the dataset's `args`, returning
                       (train, test, classes): train and test each a pair (images, labels) of
                       tensors or a Dataset of (image, label); images uint8 0-255 or float 0-1,
                       [N, C, H, W] or [C, H, W] per sample; resized to `image_size` when given

A study declares them under `datasets` (a name of its own with `source: imagefolder` or
`source: <module>:<callable>`), or names a function directly as the sweep's dataset. The
fingerprint of what a preparation read (the folder's file list with sizes and times, or the
function's source and args, and the settings) is written to meta.json: a new fingerprint
prepares anew, and the workflow reruns the cells on the data.

No torch at import: the Snakefile describes and fingerprints user datasets when it plans.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpstudy.data.registry import DATASETS, DatasetError, log
from dpstudy.util import refs
from dpstudy.util.errors import ConfigError

IMAGEFOLDER = "imagefolder"
# torchvision.datasets.folder.IMG_EXTENSIONS (a test holds them equal): what ImageFolder reads
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
DEFAULT_TEST_FRACTION = 0.2
SPLIT_SEED = 0
USER_KEYS = ("source", "path", "test_path", "test_fraction", "image_size", "channels", "args")


@dataclass(frozen=True)
class UserDataset:
    name: str  # as the study names it
    source: str  # "imagefolder" or "<module>:<callable>"
    path: str | None = None
    test_path: str | None = None
    test_fraction: float | None = None
    image_size: int | None = None
    channels: int = 3
    args: dict = field(default_factory=dict)
    code_path: str | None = None  # where the callable's module is found (the study's code_path)

    @property
    def is_folder(self) -> bool:
        return self.source == IMAGEFOLDER


def is_user(name: str) -> bool:
    """Whether `name` is a user dataset's (anything the registry does not know)."""
    return name not in DATASETS


def folder_name(name: str) -> str:
    """Where a dataset lives under the data root: its name, or a function's token (make_data_1a2b3c)."""
    return refs.token(name) if refs.split(name) else name


def in_study(study: dict[str, Any], cells: Iterable) -> dict[str, UserDataset]:
    """The user datasets `cells` train on, described from the study's `datasets` section."""
    names = sorted({cell.spec["dataset"] for cell in cells if is_user(cell.spec["dataset"])})
    return {name: describe(name, study["datasets"].get(name), study["code_path"]) for name in names}


def describe(name: str, settings: dict | None, code_path: str | None = None, where: str = "") -> UserDataset:
    """The user dataset `name` from its study settings (config `datasets.NAME`, may be empty for a
    function named directly), checked: ConfigError names the setting."""
    settings = dict(settings or {})
    where = f"{where}datasets.{name}: " if settings or not refs.split(name) else f"{where}dataset {name!r}: "
    source = settings.get("source") or (name if refs.split(name) else IMAGEFOLDER)
    if source != IMAGEFOLDER and not refs.split(source):
        raise ConfigError(f"{where}source {source!r} is neither {IMAGEFOLDER!r} nor a function <module>:<callable>")
    dataset = UserDataset(
        name=name,
        source=source,
        path=settings.get("path"),
        test_path=settings.get("test_path"),
        test_fraction=settings.get("test_fraction"),
        image_size=settings.get("image_size"),
        channels=settings.get("channels", 3),
        args=settings.get("args") or {},
        code_path=code_path,
    )
    if dataset.is_folder:
        check_folder_settings(dataset, where)
    elif dataset.path or dataset.test_path or dataset.test_fraction is not None:
        raise ConfigError(f"{where}path, test_path and test_fraction apply to source {IMAGEFOLDER!r} only")
    return dataset


def check_folder_settings(dataset: UserDataset, where: str) -> None:
    if not dataset.path:
        raise ConfigError(f"{where}an image folder needs `path` (a folder with one subfolder per class)")
    if dataset.image_size is None:
        raise ConfigError(f"{where}an image folder needs `image_size` (the side its images are resized to)")
    if dataset.args:
        raise ConfigError(f"{where}args apply to a function's dataset only")
    if dataset.test_path and dataset.test_fraction is not None:
        raise ConfigError(f"{where}give test_path or test_fraction, not both")
    train_classes = class_folders(dataset.path, f"{where}path: ")
    if dataset.test_path:
        test_classes = class_folders(dataset.test_path, f"{where}test_path: ")
        if sorted(test_classes) != sorted(train_classes):
            raise ConfigError(
                f"{where}test_path's classes {sorted(test_classes)} are not path's {sorted(train_classes)}"
            )


def class_folders(path: str, where: str) -> dict[str, list[Path]]:
    """{class: its image files} of an ImageFolder tree; ConfigError for a missing, unreadable or
    empty one, or a class folder without images."""
    root = Path(path)
    if not root.exists():
        raise ConfigError(f"{where}{path!r} does not exist (relative paths start where Snakemake runs: {os.getcwd()})")
    if not root.is_dir():
        raise ConfigError(f"{where}{path!r} is not a folder")
    if not os.access(root, os.R_OK | os.X_OK):
        raise ConfigError(f"{where}{path!r} cannot be read")
    classes = {}
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        if not os.access(folder, os.R_OK | os.X_OK):
            raise ConfigError(f"{where}class folder {str(folder)!r} cannot be read")
        images = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
        unreadable = [p for p in images if not os.access(p, os.R_OK)]
        if unreadable:
            raise ConfigError(f"{where}{len(unreadable)} images cannot be read, e.g. {str(unreadable[0])!r}")
        if not images:
            raise ConfigError(f"{where}class folder {str(folder)!r} holds no image ({', '.join(IMAGE_EXTENSIONS)})")
        classes[folder.name] = images
    if not classes:
        raise ConfigError(f"{where}{path!r} holds no class folder: an image folder has one subfolder per class")
    return classes


def fingerprint(dataset: UserDataset) -> str:
    """sha256 (16 hex digits) of what preparing `dataset` reads: its settings and, for a folder,
    every image's path, size and modification time, for a function its module's source."""
    digest = hashlib.sha256(json.dumps(settings_of(dataset), sort_keys=True).encode())
    if dataset.is_folder:
        for path in (dataset.path, dataset.test_path):
            if path:
                for files in class_folders(path, "").values():
                    for file in files:
                        stat = file.stat()
                        digest.update(f"{file.relative_to(path)}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    else:
        source = refs.source_file(dataset.source, dataset.code_path)
        digest.update(source.read_bytes() if source else dataset.source.encode())
    return digest.hexdigest()[:16]


def settings_of(dataset: UserDataset) -> dict[str, Any]:
    return {k: getattr(dataset, k) for k in USER_KEYS}


# ---- preparation (torch from here on) -----------------------------------------------------------


def read_splits(dataset: UserDataset) -> tuple[dict, list[str]]:
    """({"train": (images, labels), "test": (images, labels)}, class names) of a user dataset,
    images uint8 [N, C, S, S]."""
    if dataset.is_folder:
        return read_folder(dataset)
    return read_function(dataset)


def read_folder(dataset: UserDataset) -> tuple[dict, list[str]]:
    classes = sorted(class_folders(dataset.path, ""))
    train = load_images(dataset, dataset.path, classes)
    if dataset.test_path:
        test = load_images(dataset, dataset.test_path, classes)
    else:
        train, test = split_by_class(*train, dataset.test_fraction or DEFAULT_TEST_FRACTION)
    if not len(test[1]):
        raise DatasetError(f"dataset {dataset.name!r}: no test image (every class has a single image)")
    return {"train": train, "test": test}, classes


def load_images(dataset: UserDataset, path: str, classes: list[str]):
    """Every image of an ImageFolder tree, decoded, converted, resized and cropped."""
    import torch
    from torchvision import datasets, transforms

    mode = {1: "L", 3: "RGB"}[dataset.channels]
    resize = transforms.Compose(
        [transforms.Resize(dataset.image_size), transforms.CenterCrop(dataset.image_size), transforms.PILToTensor()]
    )
    folder = datasets.ImageFolder(path, loader=lambda p: p)  # paths: decoded below, with the file named on error
    if folder.classes != classes:
        raise DatasetError(f"dataset {dataset.name!r}: {path} has classes {folder.classes}, expected {classes}")
    images, labels = [], []
    for file, label in folder.samples:
        images.append(resize(open_image(file, mode, dataset.name)))
        labels.append(label)
    log(dataset.name, f"read {len(labels)} images of {len(classes)} classes from {path}")
    return torch.stack(images), torch.tensor(labels, dtype=torch.int64)


def open_image(file: str, mode: str, name: str):
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(file) as image:
            return image.convert(mode)
    except (OSError, UnidentifiedImageError) as error:
        raise DatasetError(f"dataset {name!r}: cannot read image {file}: {error}") from error


def split_by_class(images, labels, fraction: float):
    """(train, test): `fraction` of every class (rounded, at least one of a class of two or more)
    chosen by a seeded permutation, the rest for training."""
    import torch

    g = torch.Generator().manual_seed(SPLIT_SEED)
    test_idx = []
    for label in labels.unique().tolist():
        members = (labels == label).nonzero().flatten()
        n_test = min(len(members) - 1, max(1, round(len(members) * fraction))) if len(members) > 1 else 0
        test_idx.append(members[torch.randperm(len(members), generator=g)[:n_test]])
    test_mask = torch.zeros(len(labels), dtype=torch.bool)
    test_mask[torch.cat(test_idx)] = True
    return (images[~test_mask], labels[~test_mask]), (images[test_mask], labels[test_mask])


def read_function(dataset: UserDataset) -> tuple[dict, list[str]]:
    """The user's function called with its args, its result checked and made uint8 [N, C, S, S]."""
    function = refs.load(dataset.source, dataset.code_path)
    where = f"dataset {dataset.name!r} ({dataset.source})"
    try:
        result = function(**dataset.args)
    except TypeError as error:
        raise ConfigError(f"{where} cannot be called with args {dataset.args}: {error}") from error
    if not (isinstance(result, tuple | list) and len(result) == 3):
        raise DatasetError(f"{where} returned {type(result).__name__}; expected (train, test, classes)")
    train, test, classes = result
    classes = [str(c) for c in classes]
    splits = {split: as_tensors(data, f"{where}, {split}") for split, data in (("train", train), ("test", test))}
    splits = {split: resized(images, labels, dataset, where) for split, (images, labels) in splits.items()}
    for split, (_, labels) in splits.items():
        if len(labels) and (labels.min() < 0 or labels.max() >= len(classes)):
            raise DatasetError(f"{where}, {split}: labels outside 0..{len(classes) - 1} ({len(classes)} classes)")
    return splits, classes


def as_tensors(data, where: str):
    """(images, labels) from a pair of tensors or a Dataset of (image, label)."""
    import torch

    if isinstance(data, tuple | list) and len(data) == 2 and all(isinstance(t, torch.Tensor) for t in data):
        images, labels = data
    elif hasattr(data, "__getitem__") and hasattr(data, "__len__") and not isinstance(data, torch.Tensor):
        items = [data[i] for i in range(len(data))]
        images = torch.stack([as_image(image, where) for image, _ in items]) if items else torch.empty(0)
        labels = torch.tensor([int(label) for _, label in items], dtype=torch.int64)
    else:
        raise DatasetError(f"{where}: expected (images, labels) tensors or a Dataset, got {type(data).__name__}")
    if images.dim() != 4 or len(images) != len(labels) or not len(labels):
        raise DatasetError(
            f"{where}: images {tuple(images.shape)} and {len(labels)} labels; expected [N, C, H, W], N > 0"
        )
    return images, labels.to(torch.int64)


def as_image(image, where: str):
    import torch
    from torchvision.transforms.functional import pil_to_tensor

    if isinstance(image, torch.Tensor):
        return image
    try:
        return pil_to_tensor(image)
    except TypeError as error:
        raise DatasetError(
            f"{where}: a sample is a {type(image).__name__}, not an image tensor or PIL image"
        ) from error


def resized(images, labels, dataset: UserDataset, where: str):
    """uint8 images of side `image_size` (or their own, when square and no size is set)."""
    import torch
    from torchvision.transforms import functional as F

    if images.is_floating_point():
        images = (images.clamp(0, 1) * 255).round().to(torch.uint8)
    elif images.dtype != torch.uint8:
        raise DatasetError(f"{where}: images of dtype {images.dtype}; expected uint8 (0-255) or float (0-1)")
    if images.shape[1] not in (1, 3):
        raise DatasetError(f"{where}: {images.shape[1]} channels; expected 1 or 3")
    size = dataset.image_size
    if size is None:
        if images.shape[2] != images.shape[3]:
            raise DatasetError(f"{where}: images {tuple(images.shape[2:])} are not square: set image_size")
        return images.contiguous(), labels
    if tuple(images.shape[2:]) != (size, size):
        images = F.center_crop(F.resize(images, size, antialias=True), size)
    return images.contiguous(), labels
