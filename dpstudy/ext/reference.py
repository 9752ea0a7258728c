"""Pure-PyTorch references for the operators, used by the tests and as the benchmarks'
"PyTorch vectorised" baseline. conv2d and max_pool2d are torch.nn.functional's own."""

from __future__ import annotations

import torch
from torch import Tensor

# Grayscale weights in thousandths: 0.299 R + 0.587 G + 0.114 B (ITU-R BT.601).
GRAY_WEIGHTS = (299, 587, 114)


def rgb_to_grayscale(images: Tensor) -> Tensor:
    """The rounding rule, stated exactly: floor((299 R + 587 G + 114 B + 500) / 1000) in integers,
    i.e. round-half-up of the weighted sum. uint8 [...,3,H,W] -> uint8 [...,1,H,W]."""
    weights = torch.tensor(GRAY_WEIGHTS, dtype=torch.int32, device=images.device).view(3, 1, 1)
    total = (images.to(torch.int32) * weights).sum(dim=-3, keepdim=True)
    return torch.div(total + 500, 1000, rounding_mode="floor").to(torch.uint8)
