"""Reading a user's image folder (dpstudy.data.user's `imagefolder` source) into tensors.

Every image of the ImageFolder tree is decoded, converted to the dataset's `channels`, resized so
its shorter side is `image_size` and centre-cropped; the test split is `test_path` (the same
classes) or a seeded `test_fraction` of every class. Torch, torchvision and PIL are imported inside
the functions, when a folder is read.
"""

from __future__ import annotations

from dpstudy.data.registry import DatasetError, log
from dpstudy.data.user import DEFAULT_TEST_FRACTION, UserDataset, class_folders

SPLIT_SEED = 0


def read_folder(dataset: UserDataset) -> tuple[dict, list[str]]:
    """({"train": (images, labels), "test": (images, labels)}, class names) of an image folder,
    images uint8 [N, C, S, S]."""
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
