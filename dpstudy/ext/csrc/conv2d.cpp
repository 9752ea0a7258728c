// conv2d forward and backward for any device, given that device's im2col and col2im.
#include "conv2d.h"

#include <ATen/ops/bmm.h>
#include <ATen/ops/matmul.h>

#include "checks.h"

namespace dpstudy {

namespace {
constexpr const char* kOp = "dpstudy::conv2d";
}

ConvGeometry conv2d_geometry(const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef stride,
                             at::IntArrayRef padding) {
  check_dim(input, 4, kOp, "input", "[N, C, H, W]");
  check_dim(weight, 4, kOp, "weight", "[out_channels, in_channels, kH, kW]");
  check_floating(input, kOp, "input");
  check_like(weight, input, kOp, "weight", "input");
  check_pair(stride, 1, kOp, "stride");
  check_pair(padding, 0, kOp, "padding");
  TORCH_CHECK(weight.size(1) == input.size(1), kOp, ": 'weight' expects ", weight.size(1),
              " input channels but 'input' has ", input.size(1));
  ConvGeometry g{input.size(0), input.size(1), input.size(2), input.size(3), weight.size(0), weight.size(2),
                 weight.size(3), stride[0], stride[1], padding[0], padding[1], 0, 0};
  g.oh = (g.h + 2 * g.ph - g.kh) / g.sh + 1;
  g.ow = (g.w + 2 * g.pw - g.kw) / g.sw + 1;
  TORCH_CHECK(g.h + 2 * g.ph >= g.kh && g.w + 2 * g.pw >= g.kw && g.o > 0, kOp, ": 'weight' kernel ", g.kh, "x",
              g.kw, " is larger than the padded 'input' (", g.h + 2 * g.ph, "x", g.w + 2 * g.pw, ")");
  return g;
}

at::Tensor conv2d_forward(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                          at::IntArrayRef stride, at::IntArrayRef padding, Im2Col im2col) {
  const ConvGeometry g = conv2d_geometry(input, weight, stride, padding);
  const at::Tensor columns = im2col(input.contiguous(), g);
  at::Tensor out = at::matmul(weight.reshape({g.o, -1}), columns);  // [N, O, oh*ow]
  if (bias.has_value() && bias->defined()) {
    check_dim(*bias, 1, kOp, "bias", "[out_channels]");
    check_like(*bias, input, kOp, "bias", "input");
    TORCH_CHECK(bias->size(0) == g.o, kOp, ": 'bias' has ", bias->size(0), " values but 'weight' has ", g.o,
                " output channels");
    out.add_(bias->view({1, g.o, 1}));
  }
  return out.view({g.n, g.o, g.oh, g.ow});
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> conv2d_backward(const at::Tensor& grad_output, const at::Tensor& input,
                                                               const at::Tensor& weight, at::IntArrayRef stride,
                                                               at::IntArrayRef padding, Im2Col im2col, Col2Im col2im) {
  const ConvGeometry g = conv2d_geometry(input, weight, stride, padding);
  check_like(grad_output, input, kOp, "grad_output", "input");
  TORCH_CHECK(grad_output.sizes() == at::IntArrayRef({g.n, g.o, g.oh, g.ow}), kOp, ": 'grad_output' has size ",
              grad_output.sizes(), " but the output has size ", at::IntArrayRef({g.n, g.o, g.oh, g.ow}));
  const at::Tensor grad = grad_output.contiguous().view({g.n, g.o, g.oh * g.ow});
  // Recomputing the columns costs one im2col; saving them would cost K x the input's memory.
  const at::Tensor columns = im2col(input.contiguous(), g);
  at::Tensor grad_weight = at::bmm(grad, columns.transpose(1, 2)).sum(0).view(weight.sizes());
  at::Tensor grad_input = col2im(at::matmul(weight.reshape({g.o, -1}).t(), grad), g);
  // IntArrayRef spelled out: before 2.13 torch also has sum(DimnameList), so sum({0, 2}) is ambiguous.
  at::Tensor grad_bias = grad.sum(at::IntArrayRef{0, 2});
  return {grad_input, grad_weight, grad_bias};
}

}  // namespace dpstudy
