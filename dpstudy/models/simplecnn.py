"""SimpleCNN of source 004, Q2 (STL-10, 96x96x3)."""

from __future__ import annotations

import torch.nn as nn


class SimpleCNN(nn.Module):
    """Three [conv3x3 pad1, ReLU, maxpool2] layers (32, 64, 128), dropout, fc ->512 ->classes."""

    def __init__(self, channels: int, size: int, classes: int = 10):
        super().__init__()
        layers: list[nn.Module] = []
        for c_out in (32, 64, 128):
            layers += [nn.Conv2d(channels, c_out, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
            channels = c_out
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Dropout(0.5), nn.Linear(128 * (size // 8) ** 2, 512), nn.ReLU(), nn.Linear(512, classes)
        )

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))
