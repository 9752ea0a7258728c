"""The dataset registry: every dataset of the source reports, with its shape, classes and files,
and the text datasets (kind "text": a vocabulary instead of a shape and classes).

No torch or torchvision at import time: the Snakefile imports the registry and must stay fast.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from dpstudy.data.task import IMAGE, TEXT
from dpstudy.util.errors import ConfigError


class DatasetError(RuntimeError):
    """A dataset that cannot be obtained or read: bad checksum, unreachable server, not prepared."""


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    channels: int
    size: int  # image height == width
    classes: tuple[str, ...]
    generated: bool  # True: made from a seed by dpstudy.data.synthetic(_text), nothing to download
    files: tuple[str, ...]  # downloaded file names; must match torchvision's (tests check)
    stand_in: str | None = None  # the generated dataset of the same shape and classes, or vocabulary (config stand_in)
    kind: str = IMAGE  # IMAGE or TEXT (dpstudy.data.task); a text dataset has no shape nor classes
    vocab_size: int = 0  # text: the tokenizer's symbols (256: bytes)

    @property
    def is_text(self) -> bool:
        return self.kind == TEXT


_DIGITS = tuple(str(d) for d in range(10))
_MNIST_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
_PATTERNS = tuple(f"c{d}" for d in range(10))
BYTES = 256  # the byte tokenizer's vocabulary

DATASETS: dict[str, DatasetInfo] = {
    info.name: info
    for info in (
        DatasetInfo("mnist", 1, 28, _DIGITS, False, _MNIST_FILES, "synthetic"),
        DatasetInfo(
            "fashion_mnist",
            1,
            28,
            ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"),
            False,
            _MNIST_FILES,
            "synthetic",
        ),
        DatasetInfo(
            "cifar10",
            3,
            32,
            ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"),
            False,
            ("cifar-10-python.tar.gz",),
            "synthetic_rgb",
        ),
        DatasetInfo(
            "stl10",
            3,
            96,
            ("airplane", "bird", "car", "cat", "deer", "dog", "horse", "monkey", "ship", "truck"),
            False,
            ("stl10_binary.tar.gz",),
            "synthetic_stl",
        ),
        DatasetInfo("synthetic", 1, 28, _PATTERNS, True, ()),
        DatasetInfo("synthetic_rgb", 3, 32, _PATTERNS, True, ()),
        DatasetInfo("synthetic_stl", 3, 96, _PATTERNS, True, ()),
        # Text: byte tokens. The URL and MD5 of tiny_shakespeare's file are dpstudy.data.fetch's.
        DatasetInfo("tiny_shakespeare", 0, 0, (), False, ("input.txt",), "synthetic_text", TEXT, BYTES),
        DatasetInfo("synthetic_text", 0, 0, (), True, (), kind=TEXT, vocab_size=BYTES),
    )
}
# The overrides (config datasets.NAME) that apply to one kind of dataset only. A generated text
# dataset's sizes are tokens, an image dataset's samples.
GENERATED_ONLY = ("train_size", "test_size")
DOWNLOADED_ONLY = ("mirror", "md5")


def info(name: str) -> DatasetInfo:
    if name not in DATASETS:
        raise ConfigError(f"dataset {name!r} is not one of {sorted(DATASETS)}")
    return DATASETS[name]


def log(name: str, message: str) -> None:
    print(f"[prepare {name}] {message}", file=sys.stderr, flush=True)
