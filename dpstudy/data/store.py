"""Preparing a dataset once into compact uint8 tensor files, and reading it back.

`{root}/{name}/` holds `train.pt` and `test.pt` ({"images": uint8 [N,C,H,W], "labels": int64 [N]}),
raw downloads under `raw/`, and `meta.json`, the ready marker: it is written last, after every
file is verified and converted, so a dataset is either ready or not there at all.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpstudy.data import synthetic, user, user_folder, user_function
from dpstudy.data.registry import DATASETS, GENERATED_ONLY, DatasetError, info, log
from dpstudy.util.atomic import atomic_output, write_json
from dpstudy.util.errors import ConfigError

if TYPE_CHECKING:
    import torch

SPLITS = ("train", "test")
GENERATOR_SEED = 0
GENERATED_SIZES = {"train_size": 10000, "test_size": 2000}  # divisible by 1, 2, 4 and 8 devices


def dataset_dir(name: str, root: str | Path) -> Path:
    """root/name; a user's function's dataset under its token (dpstudy.data.user.folder_name)."""
    return Path(root) / user.folder_name(name)


def is_ready(name: str, root: str | Path) -> bool:
    return (dataset_dir(name, root) / "meta.json").is_file()


def load_meta(name: str, root: str | Path) -> dict[str, Any]:
    _require_ready(name, root)
    return json.loads((dataset_dir(name, root) / "meta.json").read_text())


def load_split(name: str, root: str | Path, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 images [N, C, H, W], int64 labels [N]) of a prepared dataset."""
    import torch

    if split not in SPLITS:
        raise ConfigError(f"split {split!r} is not one of {list(SPLITS)}")
    _require_ready(name, root)
    blob = torch.load(dataset_dir(name, root) / f"{split}.pt", weights_only=True)
    return blob["images"].contiguous(), blob["labels"]


def shape_and_classes(name: str, root: str | Path) -> tuple[tuple[int, int, int], list[str]]:
    """((channels, size, size), class names) of a dataset: the registry's, or for a user dataset
    its prepared meta.json's."""
    if not user.is_user(name):
        dataset = info(name)
        return (dataset.channels, dataset.size, dataset.size), list(dataset.classes)
    meta = load_meta(name, root)
    return tuple(meta["shape"]), meta["classes"]


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
    """(train, test) samples of a dataset before or after it is prepared: a prepared one's meta, a
    generated one's sizes (the study's overrides, else the defaults); None for a download not yet
    prepared (the memory plan then says it could not see the data)."""
    if is_ready(name, root):
        splits = load_meta(name, root)["splits"]
        return splits["train"]["n"], splits["test"]["n"]
    params = None if user.is_user(name) else _generator_params(name, overrides or {})
    return None if params is None else (params["train_size"], params["test_size"])


def _generator_params(name: str, overrides: dict) -> dict | None:
    if not DATASETS[name].generated:
        return None
    return {"seed": GENERATOR_SEED, **{key: overrides.get(key, GENERATED_SIZES[key]) for key in GENERATED_ONLY}}


def _remove_leftovers(folder: Path) -> None:
    """Temporary files and extraction folders of a prepare that was killed."""
    for path in folder.glob(".*.tmp"):
        path.unlink()
    for path in folder.glob(".extract-*"):
        shutil.rmtree(path)


def _generate(name: str, folder: Path, params: dict) -> dict[str, Any]:

    dataset = DATASETS[name]
    log(name, f"generating {params['train_size']} train + {params['test_size']} test samples, seed {params['seed']}")
    data = synthetic.splits(dataset.channels, dataset.size, **params)
    return {**_write_splits(name, folder, data, dataset.classes), "sources": {}, "generator": params}


def _read_user(dataset: user.UserDataset, folder: Path, fingerprint: str) -> dict[str, Any]:
    read = user_folder.read_folder if dataset.is_folder else user_function.read_function
    data, classes = read(dataset)
    source = {"source": dataset.source, **({"path": dataset.path} if dataset.path else {})}
    return {**_write_splits(dataset.name, folder, data, classes), "sources": source, "fingerprint": fingerprint}


def _download(name: str, folder: Path, overrides: dict) -> dict[str, Any]:
    from dpstudy.data import download  # torchvision, only for datasets that are downloaded

    sources = download.fetch(name, DATASETS[name].files, folder / "raw", overrides)
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
        _save_atomic(folder / file, {"images": images.contiguous(), "labels": labels})
        splits[split] = {"n": len(labels), "file": file, "sha256": _sha256(folder / file)}
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


def _save_atomic(path: Path, obj: Any) -> None:
    import torch

    with atomic_output(path) as tmp:
        torch.save(obj, tmp)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
