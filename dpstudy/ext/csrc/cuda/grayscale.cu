// rgb_to_grayscale on CUDA: one thread per output pixel, on the current stream.
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../grayscale.h"
#include "launch.cuh"

namespace dpstudy {

namespace {

__global__ void rgb_to_grayscale_kernel(const uint8_t* __restrict__ src, uint8_t* __restrict__ dst, int64_t plane,
                                        int64_t total) {
  DPSTUDY_CUDA_KERNEL_LOOP(i, total) {
    const uint8_t* r = src + (i / plane) * 3 * plane + i % plane;
    dst[i] = gray_pixel(r[0], r[plane], r[2 * plane]);
  }
}

at::Tensor rgb_to_grayscale_cuda(const at::Tensor& images) {
  const auto out_size = grayscale_output_size(images);
  const c10::cuda::CUDAGuard guard(images.device());
  const at::Tensor x = images.contiguous();
  at::Tensor out = at::empty(out_size, x.options());
  const int64_t total = out.numel();
  if (total == 0) return out;
  rgb_to_grayscale_kernel<<<blocks_for(total), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      x.const_data_ptr<uint8_t>(), out.mutable_data_ptr<uint8_t>(), x.size(-2) * x.size(-1), total);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(dpstudy, CUDA, m) { m.impl("rgb_to_grayscale", &rgb_to_grayscale_cuda); }

}  // namespace dpstudy
