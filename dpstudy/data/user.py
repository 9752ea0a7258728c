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
  text                 a text file or a folder of .txt files at `path`, tokenized by `tokenizer`
                       (dpstudy.data.user_text describes it, dpstudy.data.text reads it)

A study declares them under `datasets` (a name of its own with `source: imagefolder` or
`source: <module>:<callable>`, `source: text`), or names a function directly as the sweep's dataset. The
fingerprint of what a preparation read (the folder's file list with sizes and times, or the
function's source and args, and the settings) is written to meta.json: a new fingerprint
prepares anew, and the workflow reruns the cells on the data.

This module describes, checks and fingerprints user datasets, with no torch: the Snakefile does
all three when it plans. Reading them is dpstudy.data.user_folder's (an image folder) and
dpstudy.data.user_function's (a function's data), which dpstudy.data.store calls to prepare.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpstudy.data import user_text
from dpstudy.data.registry import DATASETS
from dpstudy.util import refs
from dpstudy.util.errors import ConfigError

IMAGEFOLDER = "imagefolder"
# torchvision.datasets.folder.IMG_EXTENSIONS (a test holds them equal): what ImageFolder reads
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
DEFAULT_TEST_FRACTION = 0.2
USER_KEYS = ("source", "path", "test_path", "test_fraction", "image_size", "channels", "args")
TEXT_KEYS = ("tokenizer", "vocab_size")  # a text dataset's own
OWN_KEYS = USER_KEYS + TEXT_KEYS  # every setting of a user's dataset (none applies to the registry's)


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
    tokenizer: str | None = None  # text: byte, bpe or a tokenizer.json (None: byte)
    vocab_size: int | None = None  # text with tokenizer bpe

    @property
    def is_folder(self) -> bool:
        return self.source == IMAGEFOLDER

    @property
    def is_text(self) -> bool:
        return self.source == user_text.SOURCE


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
    if source not in (IMAGEFOLDER, user_text.SOURCE) and not refs.split(source):
        raise ConfigError(
            f"{where}source {source!r} is neither {IMAGEFOLDER!r}, {user_text.SOURCE!r} nor a function "
            "<module>:<callable>"
        )
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
        tokenizer=settings.get("tokenizer"),
        vocab_size=settings.get("vocab_size"),
    )
    if dataset.is_text:
        user_text.check(dataset, settings, where)
        return dataset
    wrong = [key for key in TEXT_KEYS if settings.get(key) is not None]
    if wrong:
        raise ConfigError(f"{where}{wrong[0]} applies to source {user_text.SOURCE!r} only")
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
    every image's path, size and modification time, for a function its module's source, for a
    text its files' (and a tokenizer file's) paths, sizes and times."""
    digest = hashlib.sha256(json.dumps(settings_of(dataset), sort_keys=True).encode())
    if dataset.is_text:
        for part in user_text.fingerprint_parts(dataset):
            digest.update(part.encode())
    elif dataset.is_folder:
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
    """The dataset's settings, as describe() takes them back: an image dataset's USER_KEYS (what its
    fingerprint always hashed), a text's own."""
    return {k: getattr(dataset, k) for k in (user_text.SETTINGS if dataset.is_text else USER_KEYS)}
