// max_pool2d on CUDA: one thread per output element, forward and backward.
#include <ATen/Dispatch.h>
#include <ATen/cuda/Atomic.cuh>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../max_pool2d.h"
#include "launch.cuh"

namespace dpstudy {

namespace {

template <typename scalar_t>
__global__ void max_pool2d_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ out,
                                  int64_t* __restrict__ indices, PoolGeometry g, int64_t total) {
  DPSTUDY_CUDA_KERNEL_LOOP(e, total) {
    const int64_t ox = e % g.ow, oy = (e / g.ow) % g.oh, plane = e / (g.oh * g.ow);
    const scalar_t* src = x + plane * g.h * g.w;
    const int64_t y0 = oy * g.sh, x0 = ox * g.sw;
    int64_t best = y0 * g.w + x0;
    scalar_t best_value = src[best];
    for (int64_t y = y0; y < y0 + g.kh; ++y) {
      for (int64_t xx = x0; xx < x0 + g.kw; ++xx) {
        const scalar_t v = src[y * g.w + xx];
        if (v > best_value || isnan(v)) {
          best = y * g.w + xx;
          best_value = v;
        }
      }
    }
    out[e] = best_value;
    indices[e] = best;
  }
}

// One thread per output element. Overlapping windows (stride < kernel) can share a maximum,
// hence the atomic add; with stride >= kernel every input gets at most one term.
template <typename scalar_t>
__global__ void max_pool2d_backward_kernel(const scalar_t* __restrict__ grad, const int64_t* __restrict__ indices,
                                           scalar_t* __restrict__ grad_input, int64_t out_plane, int64_t in_plane,
                                           int64_t total) {
  DPSTUDY_CUDA_KERNEL_LOOP(o, total) {
    const int64_t i = indices[o];
    CUDA_KERNEL_ASSERT(i >= 0 && i < in_plane);
    gpuAtomicAdd(grad_input + (o / out_plane) * in_plane + i, grad[o]);
  }
}

std::tuple<at::Tensor, at::Tensor> max_pool2d_cuda(const at::Tensor& input, at::IntArrayRef kernel_size,
                                                   at::IntArrayRef stride) {
  const PoolGeometry g = max_pool2d_geometry(input, kernel_size, stride);
  const c10::cuda::CUDAGuard guard(input.device());
  const at::Tensor x = input.contiguous();
  at::Tensor out = at::empty({input.size(0), input.size(1), g.oh, g.ow}, x.options());
  at::Tensor indices = at::empty(out.sizes(), x.options().dtype(at::kLong));
  const int64_t total = out.numel();
  if (total == 0) return {out, indices};
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "dpstudy_max_pool2d_cuda", [&] {
    max_pool2d_kernel<scalar_t><<<blocks_for(total), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        x.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>(), indices.mutable_data_ptr<int64_t>(), g,
        total);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {out, indices};
}

at::Tensor max_pool2d_backward_cuda(const at::Tensor& grad_output, const at::Tensor& indices,
                                    at::IntArrayRef input_size) {
  const auto size = max_pool2d_backward_size(grad_output, indices, input_size);
  const c10::cuda::CUDAGuard guard(grad_output.device());
  const at::Tensor grad = grad_output.contiguous();
  const at::Tensor idx = indices.contiguous();
  at::Tensor grad_input = at::zeros(size, grad.options());
  const int64_t total = grad.numel();
  if (total == 0) return grad_input;
  AT_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "dpstudy_max_pool2d_backward_cuda", [&] {
    max_pool2d_backward_kernel<scalar_t><<<blocks_for(total), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        grad.const_data_ptr<scalar_t>(), idx.const_data_ptr<int64_t>(), grad_input.mutable_data_ptr<scalar_t>(),
        grad.size(2) * grad.size(3), size[2] * size[3], total);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return grad_input;
}

}  // namespace

TORCH_LIBRARY_IMPL(dpstudy, CUDA, m) {
  m.impl("max_pool2d", &max_pool2d_cuda);
  m.impl("max_pool2d_backward", &max_pool2d_backward_cuda);
}

}  // namespace dpstudy
