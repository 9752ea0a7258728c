"""A model factory of a dpstudy user's own: dpstudy calls it with the dataset's number of classes,
its input channels and image size, and the study's `model_args` (here `width`)."""

from torch import nn


def tiny_cnn(num_classes: int, in_channels: int, image_size: int, width: int = 16) -> nn.Module:
    """Two conv blocks and a linear head: small enough for a CPU, large enough to learn."""
    return nn.Sequential(
        nn.Conv2d(in_channels, width, 3, padding=1),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1),
        nn.BatchNorm2d(2 * width),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(2 * width, num_classes),
    )
