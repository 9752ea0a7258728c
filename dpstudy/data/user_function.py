"""Reading a user function's data (dpstudy.data.user's `<module>:<callable>` source) into tensors.

The function is imported from the study's code_path and called with the dataset's `args`; what
it returns, (train, test, classes) with each split a pair of tensors or a Dataset of (image,
label), is checked (every wrong shape, dtype or label one error naming the dataset) and made
uint8 [N, C, S, S]. Torch and torchvision are imported inside the functions, when the data is read.
"""

from __future__ import annotations

from dpstudy.data.registry import DatasetError
from dpstudy.data.user import UserDataset
from dpstudy.util import refs
from dpstudy.util.errors import ConfigError


def read_function(dataset: UserDataset) -> tuple[dict, list[str]]:
    """The user's function called with its args, its result checked and made uint8 [N, C, S, S]:
    ({"train": (images, labels), "test": (images, labels)}, class names)."""
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
