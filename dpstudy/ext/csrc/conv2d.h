// conv2d as im2col + matrix multiply. The drivers (conv2d.cpp) are device-agnostic ATen code;
// each backend supplies only im2col and col2im (conv2d_cpu.cpp, cuda/conv2d.cu).
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>

namespace dpstudy {

struct ConvGeometry {
  int64_t n, c, h, w;     // input
  int64_t o, kh, kw;      // weight
  int64_t sh, sw, ph, pw; // stride, padding
  int64_t oh, ow;         // output
};

// input [N,C,H,W] -> columns [N, C*kh*kw, oh*ow], zeros where the window overlaps the padding.
using Im2Col = at::Tensor (*)(const at::Tensor& input, const ConvGeometry& g);
// columns [N, C*kh*kw, oh*ow] -> [N,C,H,W], summing every column entry into its input pixel.
using Col2Im = at::Tensor (*)(const at::Tensor& columns, const ConvGeometry& g);

// Checks the arguments (naming the bad one) and returns the geometry.
ConvGeometry conv2d_geometry(const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
                             at::IntArrayRef padding);

at::Tensor conv2d_forward(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                          at::IntArrayRef stride, at::IntArrayRef padding, Im2Col im2col);

std::tuple<at::Tensor, at::Tensor, at::Tensor> conv2d_backward(const at::Tensor& grad_output, const at::Tensor& input,
                                                               const at::Tensor& weight, at::IntArrayRef stride,
                                                               at::IntArrayRef padding, Im2Col im2col, Col2Im col2im);

}  // namespace dpstudy
