"""Python side of the dpstudy operators: torch.nn.functional-style wrappers, autograd formulas
and fake (meta) kernels, so the operators work in eager mode, under autograd and under
torch.compile. Importing this module loads the library (see dpstudy.ext.load).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn.modules.utils import _pair
from torch.utils.flop_counter import conv_flop_count, register_flop_formula

from .loader import load_library

load_library()

__all__ = ["rgb_to_grayscale", "conv2d", "max_pool2d"]


def rgb_to_grayscale(images: Tensor) -> Tensor:
    """uint8 [3,H,W] or [N,3,H,W] -> uint8 [1,H,W] or [N,1,H,W].

    gray = round-half-up(0.299 R + 0.587 G + 0.114 B), computed exactly: the result is
    floor((299 R + 587 G + 114 B + 500) / 1000), identical on CPU, CUDA and in
    dpstudy.ext.reference.rgb_to_grayscale.
    """
    return torch.ops.dpstudy.rgb_to_grayscale.default(images)


def conv2d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] = 0,
) -> Tensor:
    """torch.nn.functional.conv2d for float32/float64 [N,C,H,W] (no dilation, no groups)."""
    return torch.ops.dpstudy.conv2d.default(input, weight, bias, list(_pair(stride)), list(_pair(padding)))


def max_pool2d(
    input: Tensor, kernel_size: int | tuple[int, int], stride: int | tuple[int, int] | None = None
) -> Tensor:
    """torch.nn.functional.max_pool2d for float32/float64 [N,C,H,W] (no padding, no dilation);
    stride defaults to kernel_size."""
    kernel = list(_pair(kernel_size))
    output, _ = torch.ops.dpstudy.max_pool2d.default(input, kernel, kernel if stride is None else list(_pair(stride)))
    return output


def _same_device(op: str, ref_name: str, ref: Tensor, **tensors: Tensor | None) -> None:
    for name, t in tensors.items():
        if t is not None:
            torch._check(
                t.device == ref.device,
                lambda name=name, t=t: (
                    f"{op}: {name!r} is on {t.device} but {ref_name!r} is on "
                    f"{ref.device}; all tensors must be on one device"
                ),
            )


@torch.library.register_fake("dpstudy::rgb_to_grayscale")
def _(images):
    torch._check(
        images.dim() in (3, 4) and images.shape[-3] == 3,
        lambda: "dpstudy::rgb_to_grayscale: 'images' must be [3, H, W] or [N, 3, H, W]",
    )
    torch._check(images.dtype == torch.uint8, lambda: "dpstudy::rgb_to_grayscale: 'images' must be uint8")
    return images.new_empty((*images.shape[:-3], 1, *images.shape[-2:]))


def _conv_output_size(n: int, k: int, s: int, p: int) -> int:
    return (n + 2 * p - k) // s + 1


@torch.library.register_fake("dpstudy::conv2d")
def _(input, weight, bias, stride, padding):
    _same_device("dpstudy::conv2d", "input", input, weight=weight, bias=bias)
    torch._check(
        input.dim() == 4 and weight.dim() == 4 and weight.shape[1] == input.shape[1],
        lambda: "dpstudy::conv2d: 'weight' [O, C, kH, kW] must match 'input' [N, C, H, W]",
    )
    oh, ow = (_conv_output_size(input.shape[i + 2], weight.shape[i + 2], stride[i], padding[i]) for i in (0, 1))
    return input.new_empty((input.shape[0], weight.shape[0], oh, ow))


@torch.library.register_fake("dpstudy::conv2d_backward")
def _(grad_output, input, weight, stride, padding):
    _same_device("dpstudy::conv2d", "input", input, weight=weight, grad_output=grad_output)
    return torch.empty_like(input), torch.empty_like(weight), weight.new_empty(weight.shape[0])


@torch.library.register_fake("dpstudy::max_pool2d")
def _(input, kernel_size, stride):
    torch._check(input.dim() == 4, lambda: "dpstudy::max_pool2d: 'input' must be [N, C, H, W]")
    oh, ow = ((input.shape[i + 2] - kernel_size[i]) // stride[i] + 1 for i in (0, 1))
    shape = (*input.shape[:2], oh, ow)
    return input.new_empty(shape), input.new_empty(shape, dtype=torch.int64)


@torch.library.register_fake("dpstudy::max_pool2d_backward")
def _(grad_output, indices, input_size):
    _same_device("dpstudy::max_pool2d_backward", "grad_output", grad_output, indices=indices)
    return grad_output.new_empty((*grad_output.shape[:2], *input_size))


def _conv2d_setup(ctx, inputs, output):
    input, weight, bias, stride, padding = inputs
    ctx.save_for_backward(input, weight)
    ctx.stride, ctx.padding, ctx.has_bias = stride, padding, bias is not None


def _conv2d_backward(ctx, grad):
    input, weight = ctx.saved_tensors
    grad_input, grad_weight, grad_bias = torch.ops.dpstudy.conv2d_backward.default(
        grad, input, weight, ctx.stride, ctx.padding
    )
    needs = ctx.needs_input_grad
    return (
        grad_input if needs[0] else None,
        grad_weight if needs[1] else None,
        grad_bias if ctx.has_bias and needs[2] else None,
        None,
        None,
    )


torch.library.register_autograd("dpstudy::conv2d", _conv2d_backward, setup_context=_conv2d_setup)


def _max_pool2d_setup(ctx, inputs, output):
    input = inputs[0]
    indices = output[1]
    ctx.mark_non_differentiable(indices)
    ctx.save_for_backward(indices)
    ctx.input_size = input.shape[-2:]


def _max_pool2d_backward(ctx, grad, _grad_indices):
    (indices,) = ctx.saved_tensors
    return torch.ops.dpstudy.max_pool2d_backward.default(grad, indices, list(ctx.input_size)), None, None


torch.library.register_autograd("dpstudy::max_pool2d", _max_pool2d_backward, setup_context=_max_pool2d_setup)


# FLOPs counted as for PyTorch's convolution, so FlopCounterMode sees lenet_ext like lenet.
@register_flop_formula(torch.ops.dpstudy.conv2d)
def _(x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
    return conv_flop_count(x_shape, w_shape, out_shape, transposed=False)


@register_flop_formula(torch.ops.dpstudy.conv2d_backward)
def _(grad_out_shape, x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
    # grad_input and grad_weight each take as many multiply-adds as the forward.
    return 2 * conv_flop_count(x_shape, w_shape, grad_out_shape, transposed=False)
