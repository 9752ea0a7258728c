"""ResNet-18 for small images, as in source 003 (d2l): 3x3 stem, no max-pool. `width` (model_args)
is the first stage's channels, 64 as in ResNet-18; the stages double it. A narrower one keeps the
structure (the blocks FSDP and ZeRO-3 shard, the layers, BatchNorm) at a fraction of the FLOPs: a
CPU's stand-in (config/studies/fsdp_vs_deepspeed.yaml)."""

from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F


class Residual(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = (
            nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))
            if stride != 1 or c_in != c_out
            else nn.Identity()
        )

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class ResNet18(nn.Module):
    def __init__(self, channels: int, size: int, classes: int = 10, width: int = 64):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(channels, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()
        )
        stages, c_in = [], width
        for c_out, stride in ((width, 1), (2 * width, 2), (4 * width, 2), (8 * width, 2)):
            stages += [Residual(c_in, c_out, stride), Residual(c_out, c_out, 1)]
            c_in = c_out
        self.stages = nn.Sequential(*stages)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8 * width, classes))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Source 003 initialises conv and linear weights from N(0, 0.01).
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.normal_(m.weight, 0.0, 0.01)

    def forward(self, x):
        return self.head(self.stages(self.stem(x)))
