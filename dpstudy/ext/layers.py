"""nn.Conv2d and nn.MaxPool2d that run the extension's operators, with the same parameters and
state_dict keys as the modules they replace."""

from __future__ import annotations

import torch.nn as nn
from torch import Tensor

from . import ops


class ExtConv2d(nn.Conv2d):
    """nn.Conv2d computed by dpstudy::conv2d (zero padding, no dilation, no groups)."""

    def forward(self, input: Tensor) -> Tensor:
        return ops.conv2d(input, self.weight, self.bias, self.stride, self.padding)


class ExtMaxPool2d(nn.MaxPool2d):
    """nn.MaxPool2d computed by dpstudy::max_pool2d (no padding, no dilation, floor mode)."""

    def forward(self, input: Tensor) -> Tensor:
        return ops.max_pool2d(input, self.kernel_size, self.stride)


def convert(module: nn.Module) -> nn.Module:
    """Replace every nn.Conv2d and nn.MaxPool2d in `module` (in place) by its extension twin,
    sharing the parameters; returns `module`. Unsupported settings are errors."""
    for name, child in module.named_children():
        if type(child) is nn.Conv2d:
            setattr(module, name, _ext_conv(child))
        elif type(child) is nn.MaxPool2d:
            setattr(module, name, _ext_pool(child))
        else:
            convert(child)
    return module


def _ext_conv(conv: nn.Conv2d) -> ExtConv2d:
    if conv.groups != 1 or conv.dilation != (1, 1) or conv.padding_mode != "zeros" or isinstance(conv.padding, str):
        raise ValueError(f"ExtConv2d supports groups=1, dilation=1, numeric zero padding; got {conv}")
    ext = ExtConv2d(
        conv.in_channels,
        conv.out_channels,
        conv.kernel_size,
        conv.stride,
        conv.padding,
        bias=conv.bias is not None,
        device="meta",
    )
    ext.weight, ext.bias = conv.weight, conv.bias
    return ext


def _ext_pool(pool: nn.MaxPool2d) -> ExtMaxPool2d:
    if pool.padding not in (0, (0, 0)) or pool.dilation not in (1, (1, 1)) or pool.ceil_mode or pool.return_indices:
        raise ValueError(f"ExtMaxPool2d supports padding=0, dilation=1, ceil_mode=False; got {pool}")
    return ExtMaxPool2d(pool.kernel_size, pool.stride)
