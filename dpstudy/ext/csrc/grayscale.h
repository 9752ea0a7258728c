// rgb_to_grayscale: the rounding rule and the shape checks, shared by the CPU and CUDA kernels.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/macros/Macros.h>

#include "checks.h"

namespace dpstudy {

// gray = round-half-up(0.299 R + 0.587 G + 0.114 B), i.e. floor((299 R + 587 G + 114 B + 500) / 1000)
// computed exactly. In float32: every integer below 2^24 is exact, so the weighted sum is exact
// whatever the compiler fuses; x * 0.001f lies in [x/1000, x/1000 + 3e-5] for x <= 255500 (0.001f
// rounds up), which is below the next integer, so truncation gives the exact floor. The tests
// check every one of the 2^24 RGB triples against the integer formula.
C10_HOST_DEVICE inline uint8_t gray_pixel(uint8_t r, uint8_t g, uint8_t b) {
  const float x = 299.0f * r + 587.0f * g + 114.0f * b + 500.0f;
  return static_cast<uint8_t>(static_cast<int32_t>(x * 0.001f));
}

// Checks `images` ([3,H,W] or [N,3,H,W] uint8) and returns the output size ([1,H,W] or [N,1,H,W]).
inline std::vector<int64_t> grayscale_output_size(const at::Tensor& images) {
  const char* op = "dpstudy::rgb_to_grayscale";
  TORCH_CHECK(images.dim() == 3 || images.dim() == 4, op,
              ": 'images' must be [3, H, W] or [N, 3, H, W], got ", images.dim(), "-D");
  TORCH_CHECK(images.scalar_type() == at::kByte, op, ": 'images' must be uint8, got ", images.scalar_type());
  TORCH_CHECK(images.size(-3) == 3, op, ": 'images' must have 3 channels (RGB) in dim -3, got ",
              images.size(-3));
  std::vector<int64_t> size = images.sizes().vec();
  size[size.size() - 3] = 1;
  return size;
}

}  // namespace dpstudy
