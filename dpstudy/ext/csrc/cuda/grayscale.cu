// rgb_to_grayscale on CUDA, on the current stream. The kernel is bound by memory: each thread
// moves 16 pixels with one 16-byte load per plane and one 16-byte store where every plane's rows
// allow it (plane size a multiple of 16, 16-byte aligned pointers); otherwise one thread per pixel.
// Per-pixel 64-bit division and byte loads held the first version to 16 % of an H200's bandwidth.
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

constexpr int64_t kVector = sizeof(uint4);  // pixels per thread in the vector kernel

__global__ void rgb_to_grayscale_vector_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst,
                                               int64_t plane_vectors, int64_t total_vectors) {
  DPSTUDY_CUDA_KERNEL_LOOP(v, total_vectors) {
    const int64_t image = v / plane_vectors;
    const uint4* r = src + 2 * image * plane_vectors + v;  // = image * 3 * plane + (v - image * plane)
    const uint4 red = __ldg(r), green = __ldg(r + plane_vectors), blue = __ldg(r + 2 * plane_vectors);
    const auto* rb = reinterpret_cast<const uint8_t*>(&red);
    const auto* gb = reinterpret_cast<const uint8_t*>(&green);
    const auto* bb = reinterpret_cast<const uint8_t*>(&blue);
    uint4 gray;
    auto* out = reinterpret_cast<uint8_t*>(&gray);
#pragma unroll
    for (int k = 0; k < kVector; ++k) out[k] = gray_pixel(rb[k], gb[k], bb[k]);
    dst[v] = gray;
  }
}

bool aligned(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % kVector == 0; }

at::Tensor rgb_to_grayscale_cuda(const at::Tensor& images) {
  const auto out_size = grayscale_output_size(images);
  const c10::cuda::CUDAGuard guard(images.device());
  const at::Tensor x = images.contiguous();
  at::Tensor out = at::empty(out_size, x.options());
  const int64_t total = out.numel();
  if (total == 0) return out;
  const int64_t plane = x.size(-2) * x.size(-1);
  const uint8_t* src = x.const_data_ptr<uint8_t>();
  uint8_t* dst = out.mutable_data_ptr<uint8_t>();
  const auto stream = c10::cuda::getCurrentCUDAStream();
  if (plane % kVector == 0 && aligned(src) && aligned(dst)) {
    const int64_t vectors = total / kVector;
    rgb_to_grayscale_vector_kernel<<<blocks_for(vectors), kThreads, 0, stream>>>(
        reinterpret_cast<const uint4*>(src), reinterpret_cast<uint4*>(dst), plane / kVector, vectors);
  } else {
    rgb_to_grayscale_kernel<<<blocks_for(total), kThreads, 0, stream>>>(src, dst, plane, total);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(dpstudy, CUDA, m) { m.impl("rgb_to_grayscale", &rgb_to_grayscale_cuda); }

}  // namespace dpstudy
