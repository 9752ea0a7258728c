"""LeNet variant of source 000, experiment 1."""

from __future__ import annotations

import torch.nn as nn


class LeNet(nn.Module):
    """conv3x3(C->6) ReLU pool, conv3x3(6->16) ReLU pool, fc ->120 ->84 ->classes.

    On 32x32 inputs the flattened features are 16*8*8 = 1024 as in the source; other sizes adapt.
    """

    def __init__(self, channels: int, size: int, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(channels, 6, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Linear(16 * (size // 4) ** 2, 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, classes),
        )

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))
