// conv2d on CUDA: im2col and col2im kernels; the drivers in conv2d.cpp do the matrix
// multiplies with cuBLAS through ATen, on the same current stream.
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../conv2d.h"
#include "launch.cuh"

namespace dpstudy {

namespace {

// One thread per column entry: columns[n][(c*kh + i)*kw + j][oy*ow + ox].
template <typename scalar_t>
__global__ void im2col_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ cols, ConvGeometry g,
                              int64_t total) {
  DPSTUDY_CUDA_KERNEL_LOOP(e, total) {
    const int64_t ox = e % g.ow, oy = (e / g.ow) % g.oh;
    const int64_t row = e / (g.oh * g.ow);  // n * C*kh*kw + (c*kh + i)*kw + j
    const int64_t j = row % g.kw, i = (row / g.kw) % g.kh, plane = row / (g.kh * g.kw);  // plane = n*C + c
    const int64_t y = oy * g.sh - g.ph + i, xx = ox * g.sw - g.pw + j;
    cols[e] = (y >= 0 && y < g.h && xx >= 0 && xx < g.w) ? x[(plane * g.h + y) * g.w + xx] : scalar_t(0);
  }
}

// One thread per input pixel, gathering every column entry that read it: no atomics, and the
// sum order is fixed, so the result is deterministic.
template <typename scalar_t>
__global__ void col2im_kernel(const scalar_t* __restrict__ cols, scalar_t* __restrict__ x, ConvGeometry g,
                              int64_t total) {
  DPSTUDY_CUDA_KERNEL_LOOP(e, total) {
    const int64_t xx = e % g.w, y = (e / g.w) % g.h, plane = e / (g.h * g.w);
    const int64_t length = g.oh * g.ow;
    scalar_t sum = 0;
    for (int64_t i = 0; i < g.kh; ++i) {
      const int64_t ty = y + g.ph - i;
      if (ty < 0 || ty % g.sh != 0 || ty / g.sh >= g.oh) continue;
      for (int64_t j = 0; j < g.kw; ++j) {
        const int64_t tx = xx + g.pw - j;
        if (tx < 0 || tx % g.sw != 0 || tx / g.sw >= g.ow) continue;
        sum += cols[((plane * g.kh + i) * g.kw + j) * length + (ty / g.sh) * g.ow + tx / g.sw];
      }
    }
    x[e] = sum;
  }
}

at::Tensor im2col_cuda(const at::Tensor& input, const ConvGeometry& g) {
  at::Tensor columns = at::empty({g.n, g.c * g.kh * g.kw, g.oh * g.ow}, input.options());
  const int64_t total = columns.numel();
  if (total == 0) return columns;
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "dpstudy_im2col_cuda", [&] {
    im2col_kernel<scalar_t><<<blocks_for(total), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        input.const_data_ptr<scalar_t>(), columns.mutable_data_ptr<scalar_t>(), g, total);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return columns;
}

at::Tensor col2im_cuda(const at::Tensor& columns, const ConvGeometry& g) {
  at::Tensor input = at::empty({g.n, g.c, g.h, g.w}, columns.options());
  const at::Tensor cols_c = columns.contiguous();
  const int64_t total = input.numel();
  if (total == 0) return input;
  AT_DISPATCH_FLOATING_TYPES(columns.scalar_type(), "dpstudy_col2im_cuda", [&] {
    col2im_kernel<scalar_t><<<blocks_for(total), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        cols_c.const_data_ptr<scalar_t>(), input.mutable_data_ptr<scalar_t>(), g, total);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return input;
}

at::Tensor conv2d_cuda(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       at::IntArrayRef stride, at::IntArrayRef padding) {
  const c10::cuda::CUDAGuard guard(input.device());
  return conv2d_forward(input, weight, bias, stride, padding, &im2col_cuda);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> conv2d_backward_cuda(const at::Tensor& grad_output,
                                                                    const at::Tensor& input, const at::Tensor& weight,
                                                                    at::IntArrayRef stride, at::IntArrayRef padding) {
  const c10::cuda::CUDAGuard guard(input.device());
  return conv2d_backward(grad_output, input, weight, stride, padding, &im2col_cuda, &col2im_cuda);
}

}  // namespace

TORCH_LIBRARY_IMPL(dpstudy, CUDA, m) {
  m.impl("conv2d", &conv2d_cuda);
  m.impl("conv2d_backward", &conv2d_backward_cuda);
}

}  // namespace dpstudy
