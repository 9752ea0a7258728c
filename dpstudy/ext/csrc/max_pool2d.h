// max_pool2d (no padding, dilation 1, floor mode): geometry and checks shared by CPU and CUDA.
// `indices` hold each maximum's flat position y * W + x within its (sample, channel) plane, as
// torch.nn.functional.max_pool2d(return_indices=True) does; ties go to the first in row-major
// order and NaN wins, also as in PyTorch.
#pragma once

#include <ATen/core/Tensor.h>

#include "checks.h"

namespace dpstudy {

struct PoolGeometry {
  int64_t planes, h, w;  // input: N*C planes of H x W
  int64_t kh, kw, sh, sw;
  int64_t oh, ow;
};

inline PoolGeometry max_pool2d_geometry(const at::Tensor& input, at::IntArrayRef kernel_size, at::IntArrayRef stride) {
  const char* op = "dpstudy::max_pool2d";
  check_dim(input, 4, op, "input", "[N, C, H, W]");
  check_floating(input, op, "input");
  check_pair(kernel_size, 1, op, "kernel_size");
  check_pair(stride, 1, op, "stride");
  TORCH_CHECK(input.size(2) >= kernel_size[0] && input.size(3) >= kernel_size[1], op, ": 'kernel_size' ",
              kernel_size, " is larger than 'input' (", input.size(2), "x", input.size(3), ")");
  return {input.size(0) * input.size(1), input.size(2), input.size(3), kernel_size[0], kernel_size[1], stride[0],
          stride[1], (input.size(2) - kernel_size[0]) / stride[0] + 1, (input.size(3) - kernel_size[1]) / stride[1] + 1};
}

// Checks the backward's arguments and returns the size of grad_input.
inline std::vector<int64_t> max_pool2d_backward_size(const at::Tensor& grad_output, const at::Tensor& indices,
                                                     at::IntArrayRef input_size) {
  const char* op = "dpstudy::max_pool2d_backward";
  check_dim(grad_output, 4, op, "grad_output", "[N, C, oH, oW]");
  check_floating(grad_output, op, "grad_output");
  TORCH_CHECK(indices.scalar_type() == at::kLong, op, ": 'indices' must be int64, got ", indices.scalar_type());
  TORCH_CHECK(indices.device() == grad_output.device(), op, ": 'indices' is on ", indices.device(),
              " but 'grad_output' is on ", grad_output.device(), "; all tensors must be on one device");
  TORCH_CHECK(indices.sizes() == grad_output.sizes(), op, ": 'indices' has size ", indices.sizes(),
              " but 'grad_output' has size ", grad_output.sizes());
  check_pair(input_size, 1, op, "input_size");
  return {grad_output.size(0), grad_output.size(1), input_size[0], input_size[1]};
}

}  // namespace dpstudy
