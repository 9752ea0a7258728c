"""The Python loops of the source reports, as baselines. They index tensors element by element,
as the sources did; each takes a `limit` so the benchmark can time a subset and scale it up."""

from __future__ import annotations

import torch
from torch import Tensor

from dpstudy.ext.reference import GRAY_WEIGHTS


def rgb_to_grayscale_loop(image: Tensor, rows: int | None = None) -> Tensor:
    """Source 004's rgb2grey_py: a double loop over one [3,H,W] image's pixels, here with the
    extension's exact rounding so results can be compared. Only the first `rows` rows are done."""
    height, width = image.size(1), image.size(2)
    wr, wg, wb = GRAY_WEIGHTS
    gray = torch.zeros((1, height, width), dtype=torch.uint8)
    for i in range(min(rows or height, height)):
        for j in range(width):
            r = image[0][i][j]
            g = image[1][i][j]
            b = image[2][i][j]
            gray[0][i][j] = (wr * int(r) + wg * int(g) + wb * int(b) + 500) // 1000
    return gray


def max_pool2d_backward_loop(
    grad_output: Tensor, input: Tensor, kernel: int, stride: int, planes: int | None = None
) -> Tensor:
    """Source 002's for-loop max-pool backward: for every window, find the maximum of the input
    and add the window's gradient there. Only the first `planes` (sample, channel) planes are done."""
    grad_input = torch.zeros_like(input)
    n, c, oh, ow = grad_output.shape
    for p in range(min(planes or n * c, n * c)):
        s, ch = divmod(p, c)
        for oy in range(oh):
            for ox in range(ow):
                window = input[s, ch, oy * stride : oy * stride + kernel, ox * stride : ox * stride + kernel]
                k = int(torch.argmax(window))
                grad_input[s, ch, oy * stride + k // kernel, ox * stride + k % kernel] += grad_output[s, ch, oy, ox]
    return grad_input
