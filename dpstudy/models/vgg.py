"""VGG-style networks with BatchNorm: source 000 experiment 2 and source 001's VGG-19."""

from __future__ import annotations

import torch.nn as nn

VGG19_LAYERS = [
    64,
    64,
    "M",
    128,
    128,
    "M",
    256,
    256,
    256,
    256,
    "M",
    512,
    512,
    512,
    512,
    "M",
    512,
    512,
    512,
    512,
    "M",
]  # config E


def vgg_bn_layers() -> list:
    """Source 000: five blocks of min(2^(i+6), 512) channels, x2 convs below 256, else x4."""
    layers: list = []
    for i in range(5):
        out = min(2 ** (i + 6), 512)
        layers += [out] * (2 if out < 256 else 4) + ["M"]
    return layers


def features(layers: list, channels: int, size: int) -> tuple[nn.Sequential, int]:
    """conv3x3+BN+ReLU stacks; a pool halves the image only while it is at least 2 pixels."""
    modules: list[nn.Module] = []
    for item in layers:
        if item == "M":
            if size >= 2:
                modules.append(nn.MaxPool2d(2))
                size //= 2
        else:
            modules += [nn.Conv2d(channels, item, 3, padding=1), nn.BatchNorm2d(item), nn.ReLU(inplace=True)]
            channels = item
    # Small images (28x28 has only four halvings) end with a global pool so the head stays 512 wide.
    modules.append(nn.AdaptiveAvgPool2d(1))
    return nn.Sequential(*modules), channels


def head(widths: list[int], classes: int, dropout: float = 0.5) -> nn.Sequential:
    modules: list[nn.Module] = []
    for w_in, w_out in zip(widths, widths[1:]):
        modules += [nn.Linear(w_in, w_out), nn.ReLU(inplace=True), nn.Dropout(dropout)]
    modules.append(nn.Linear(widths[-1], classes))
    return nn.Sequential(*modules)


class VGGBN(nn.Module):
    """Source 000 experiment 2; head fc 512->256->128->classes with ReLU + Dropout."""

    def __init__(self, channels: int, size: int, classes: int = 10):
        super().__init__()
        self.features, width = features(vgg_bn_layers(), channels, size)
        self.classifier = head([width, 256, 128], classes)

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))


class VGG19(nn.Module):
    """Source 001: VGG-19 (16 conv + 3 fc) with BatchNorm and a CIFAR-size head 512->512->512->classes."""

    def __init__(self, channels: int, size: int, classes: int = 10):
        super().__init__()
        self.features, width = features(VGG19_LAYERS, channels, size)
        self.classifier = head([width, 512, 512], classes)

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))
