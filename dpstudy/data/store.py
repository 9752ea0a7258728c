"""Preparing a dataset once into compact tensor files, and reading it back.

`{root}/{name}/` holds `train.pt` and `test.pt` ({"images": uint8 [N,C,H,W], "labels": int64 [N]};
a text dataset's {"tokens": 1-D uint8 or int32}, dpstudy.data.text), raw downloads under `raw/`,
and `meta.json`, the ready marker: it is written last, after every file is verified and
converted, so a dataset is either ready or not there at all. A meta.json without `kind` is an
image dataset's (image datasets' meta.json never had one).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpstudy.data import user, user_folder, user_function, user_text
from dpstudy.data.files import save_atomic, sha256_of
from dpstudy.data.registry import DATASETS, GENERATED_ONLY, DatasetError, info, log
from dpstudy.data.task import IMAGE, TEXT, Task
from dpstudy.util.atomic import write_json
from dpstudy.util.errors import ConfigError

if TYPE_CHECKING:
    import torch

SPLITS = ("train", "test")
GENERATOR_SEED = 0
GENERATED_SIZES = {"train_size": 10000, "test_size": 2000}  # divisible by 1, 2, 4 and 8 devices
# synthetic_text's tokens: a GPT of 2 layers, d_model 64, seq_len 128 trains an epoch in about 2 s
# on 2 CPU cores (1,562 windows of 128) and learns it within 2 or 3 (dpstudy.data.synthetic_text).
GENERATED_TEXT_SIZES = {"train_size": 200_000, "test_size": 20_000}


def dataset_dir(name: str, root: str | Path) -> Path:
    """root/name; a user's function's dataset under its token (dpstudy.data.user.folder_name)."""
    return Path(root) / user.folder_name(name)


def is_ready(name: str, root: str | Path) -> bool:
    return (dataset_dir(name, root) / "meta.json").is_file()


def load_meta(name: str, root: str | Path) -> dict[str, Any]:
    _require_ready(name, root)
    return json.loads((dataset_dir(name, root) / "meta.json").read_text())


def kind_of(meta: dict[str, Any]) -> str:
    return meta.get("kind", IMAGE)


def load_split(name: str, root: str | Path, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 images [N, C, H, W], int64 labels [N]) of a prepared image dataset."""
    blob = _load_blob(name, root, split, IMAGE)
    return blob["images"].contiguous(), blob["labels"]


def load_tokens(name: str, root: str | Path, split: str) -> torch.Tensor:
    """The 1-D tokens of a prepared text dataset's split: uint8 when its vocabulary fits a byte,
    else int32 (as stored: a loader widens a batch, never the whole split)."""
    return _load_blob(name, root, split, TEXT)["tokens"]


def _load_blob(name: str, root: str | Path, split: str, kind: str) -> dict:
    import torch

    if split not in SPLITS:
        raise ConfigError(f"split {split!r} is not one of {list(SPLITS)}")
    stored = kind_of(load_meta(name, root))
    if stored != kind:
        reader = "load_tokens" if stored == TEXT else "load_split"
        article = {IMAGE: "an image", TEXT: "a text"}
        raise DatasetError(
            f"dataset {name!r} is {article[stored]} dataset, not {article[kind]} one: read it with {reader}"
        )
    return torch.load(dataset_dir(name, root) / f"{split}.pt", weights_only=True)


def shape_and_classes(name: str, root: str | Path) -> tuple[tuple[int, int, int], list[str]]:
    """((channels, size, size), class names) of an image dataset: the registry's, or for a user
    dataset its prepared meta.json's. A text dataset has neither: see data_task."""
    if not user.is_user(name):
        dataset = info(name)
        if dataset.is_text:
            raise ConfigError(f"dataset {name!r} is a text dataset: it has no image shape nor classes")
        return (dataset.channels, dataset.size, dataset.size), list(dataset.classes)
    meta = load_meta(name, root)
    if kind_of(meta) == TEXT:
        raise ConfigError(f"dataset {name!r} is a text dataset: it has no image shape nor classes")
    return tuple(meta["shape"]), meta["classes"]


def data_task(
    name: str,
    root: str | Path,
    seq_len: int | Callable[[], int] | None,
    overrides: dict | None = None,
    code_path: str | None = None,
) -> Task:
    """What a model needs of the dataset (dpstudy.data.task.Task), before or after it is prepared
    for the registry's datasets and a user's text (its settings, `overrides`, tell the
    vocabulary: 256 bytes, the BPE's vocab_size, a tokenizer file's); a user's images and a user
    dataset given without its settings from the prepared meta.json. A text task takes `seq_len`,
    or a function that gives it (a cell's window, which depends on its model: asked only of text)."""
    if not user.is_user(name):
        dataset = info(name)
        if not dataset.is_text:
            return Task.image(dataset.channels, dataset.size, len(dataset.classes))
        return Task.text(dataset.vocab_size, _seq_len(name, seq_len))
    own = user.describe(name, overrides, code_path) if overrides is not None else None
    if own is not None and own.is_text:
        return Task.text(user_text.vocab_size(own), _seq_len(name, seq_len))
    meta = load_meta(name, root)
    if kind_of(meta) == TEXT:
        return Task.text(meta["vocab_size"], _seq_len(name, seq_len))
    return Task.image(meta["shape"][0], meta["shape"][1], len(meta["classes"]))


def _seq_len(name: str, seq_len: int | Callable[[], int] | None) -> int:
    if callable(seq_len):
        return seq_len()
    if seq_len is None:
        raise ConfigError(f"dataset {name!r} is a text dataset: set seq_len, the tokens of a sample's input")
    return seq_len


def _require_ready(name: str, root: str | Path) -> None:
    if not user.is_user(name):
        info(name)
    if not is_ready(name, root):
        raise DatasetError(
            f"dataset {name!r} is not prepared under {root}: run `snakemake prepare_data` "
            f"or `python scripts/prepare_data.py {name} --root {root}` first"
        )


def prepare(name: str, root: str | Path, overrides: dict | None = None, code_path: str | None = None) -> Path:
    """Make the dataset ready under root/name (download + verify, generate, or read a user's
    folder or function: dpstudy.data.user_folder, dpstudy.data.user_function); returns that
    folder. `overrides` are the study's settings of the dataset (config datasets.NAME),
    `code_path` where a user's function is found.

    Does nothing when it is ready already. Safe against concurrent calls (a file lock) and
    against being killed (temporary files, meta.json last).
    """
    from filelock import FileLock

    overrides = overrides or {}  # validated with the study (dpstudy.study.datasets.check_overrides)
    own = user.describe(name, overrides, code_path) if user.is_user(name) else None
    folder = dataset_dir(name, root)
    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(folder / ".prepare.lock"):
        wanted = user.fingerprint(own) if own else _generator_params(name, overrides)
        marker = "fingerprint" if own else "generator"
        if is_ready(name, root) and load_meta(name, root).get(marker) == wanted:
            return folder
        (folder / "meta.json").unlink(missing_ok=True)  # the splits are about to change
        _remove_leftovers(folder)
        if own:
            meta = _read_user(own, folder, wanted)
        elif DATASETS[name].generated:
            meta = _generate(name, folder, wanted)
        else:
            meta = _download(name, folder, overrides)
        write_json(folder / "meta.json", meta)
    log(name, f"ready in {folder}")
    return folder


def split_sizes(name: str, root: str | Path, overrides: dict | None = None) -> tuple[int, int] | None:
    """(train, test) samples (a text dataset's: tokens) of a dataset before or after it is
    prepared: a prepared one's meta, a generated one's sizes (the study's overrides, else the
    defaults); None for a download or a user's data not yet prepared (the memory plan then says it
    could not see the data)."""
    if is_ready(name, root):
        splits = load_meta(name, root)["splits"]
        return splits["train"]["n"], splits["test"]["n"]
    params = None if user.is_user(name) else _generator_params(name, overrides or {})
    return None if params is None else (params["train_size"], params["test_size"])


def _generator_params(name: str, overrides: dict) -> dict | None:
    if not DATASETS[name].generated:
        return None
    defaults = GENERATED_TEXT_SIZES if DATASETS[name].is_text else GENERATED_SIZES
    return {"seed": GENERATOR_SEED, **{key: overrides.get(key, defaults[key]) for key in GENERATED_ONLY}}


def _remove_leftovers(folder: Path) -> None:
    """Temporary files and extraction folders of a prepare that was killed."""
    for path in folder.glob(".*.tmp"):
        path.unlink()
    for path in folder.glob(".extract-*"):
        shutil.rmtree(path)


def _generate(name: str, folder: Path, params: dict) -> dict[str, Any]:
    dataset = DATASETS[name]
    if dataset.is_text:
        from dpstudy.data import text

        return text.generate(name, folder, params)
    log(name, f"generating {params['train_size']} train + {params['test_size']} test samples, seed {params['seed']}")
    from dpstudy.data import synthetic  # torch: only where images are generated, not where the study is planned

    data = synthetic.splits(dataset.channels, dataset.size, **params)
    return {**_write_splits(name, folder, data, dataset.classes), "sources": {}, "generator": params}


def _read_user(dataset: user.UserDataset, folder: Path, fingerprint: str) -> dict[str, Any]:
    source = {"source": dataset.source, **({"path": dataset.path} if dataset.path else {})}
    if dataset.is_text:
        from dpstudy.data import text

        return {**text.from_user(dataset, folder), "sources": source, "fingerprint": fingerprint}
    read = user_folder.read_folder if dataset.is_folder else user_function.read_function
    data, classes = read(dataset)
    return {**_write_splits(dataset.name, folder, data, classes), "sources": source, "fingerprint": fingerprint}


def _download(name: str, folder: Path, overrides: dict) -> dict[str, Any]:
    from dpstudy.data import fetch

    sources = fetch.fetch(name, DATASETS[name].files, folder / "raw", overrides)
    if DATASETS[name].is_text:
        from dpstudy.data import text

        return {**text.from_download(name, folder, folder / "raw" / DATASETS[name].files[0]), "sources": sources}
    from dpstudy.data import download  # torchvision, only for the image datasets that are downloaded

    workdir = Path(tempfile.mkdtemp(dir=folder, prefix=".extract-"))
    try:
        data = download.read_splits(name, folder / "raw", workdir)
    finally:
        shutil.rmtree(workdir)  # the verified archives stay; extracted copies would double the disk use
    _check_shapes(name, data)
    return {**_write_splits(name, folder, data, DATASETS[name].classes), "sources": sources}


def _check_shapes(name: str, data: dict) -> None:
    dataset = DATASETS[name]
    expected = (dataset.channels, dataset.size, dataset.size)
    for split, (images, labels) in data.items():
        if tuple(images.shape[1:]) != expected or len(images) != len(labels) or not len(labels):
            raise DatasetError(
                f"dataset {name!r}: {split} split has images {tuple(images.shape)} and "
                f"{len(labels)} labels, expected [N, {', '.join(map(str, expected))}]"
            )
        if labels.min() < 0 or labels.max() >= len(dataset.classes):
            raise DatasetError(f"dataset {name!r}: {split} labels outside 0..{len(dataset.classes) - 1}")


def _write_splits(name: str, folder: Path, data: dict, classes) -> dict[str, Any]:
    """Write train.pt/test.pt; return the meta fields that describe them."""
    splits = {}
    for split, (images, labels) in data.items():
        file = f"{split}.pt"
        save_atomic(folder / file, {"images": images.contiguous(), "labels": labels})
        splits[split] = {"n": len(labels), "file": file, "sha256": sha256_of(folder / file)}
        log(name, f"converted {len(labels)} {split} samples")
    mean, std = channel_stats(data["train"][0])
    return {
        "name": name,
        "shape": list(data["train"][0].shape[1:]),
        "classes": list(classes),
        "mean": mean,
        "std": std,
        "splits": splits,
    }


def channel_stats(images: torch.Tensor) -> tuple[list[float], list[float]]:
    """Per-channel mean and (unbiased) std of uint8 images scaled to 0..1, exact, from a
    256-bin histogram: a float copy of CIFAR-10 would take gigabytes."""
    import torch

    values = torch.arange(256, dtype=torch.float64) / 255
    means, stds = [], []
    for c in range(images.shape[1]):
        counts = torch.bincount(images[:, c].flatten(), minlength=256).to(torch.float64)
        n = counts.sum()
        mean = (counts * values).sum() / n
        means.append(mean.item())
        stds.append(((counts * (values - mean) ** 2).sum() / (n - 1)).sqrt().item())
    return means, stds
