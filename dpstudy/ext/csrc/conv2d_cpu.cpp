// conv2d on CPU: im2col and col2im parallel over (sample, channel) planes; the matrix
// multiplies in conv2d.cpp run on ATen's BLAS.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>

#include "conv2d.h"
#include "parallel.h"

namespace dpstudy {

namespace {

template <typename scalar_t>
void im2col_plane(const scalar_t* x, scalar_t* cols, const ConvGeometry& g) {
  const int64_t length = g.oh * g.ow;
  for (int64_t i = 0; i < g.kh; ++i) {
    for (int64_t j = 0; j < g.kw; ++j, cols += length) {
      for (int64_t oy = 0; oy < g.oh; ++oy) {
        const int64_t y = oy * g.sh - g.ph + i;
        scalar_t* row = cols + oy * g.ow;
        if (y < 0 || y >= g.h) {
          std::fill(row, row + g.ow, scalar_t(0));
          continue;
        }
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          const int64_t xx = ox * g.sw - g.pw + j;
          row[ox] = (xx >= 0 && xx < g.w) ? x[y * g.w + xx] : scalar_t(0);
        }
      }
    }
  }
}

template <typename scalar_t>
void col2im_plane(const scalar_t* cols, scalar_t* x, const ConvGeometry& g) {
  const int64_t length = g.oh * g.ow;
  for (int64_t i = 0; i < g.kh; ++i) {
    for (int64_t j = 0; j < g.kw; ++j, cols += length) {
      for (int64_t oy = 0; oy < g.oh; ++oy) {
        const int64_t y = oy * g.sh - g.ph + i;
        if (y < 0 || y >= g.h) continue;
        const scalar_t* row = cols + oy * g.ow;
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          const int64_t xx = ox * g.sw - g.pw + j;
          if (xx >= 0 && xx < g.w) x[y * g.w + xx] += row[ox];
        }
      }
    }
  }
}

// Each task owns whole (sample, channel) planes: no two tasks write the same memory.
at::Tensor im2col_cpu(const at::Tensor& input, const ConvGeometry& g) {
  at::Tensor columns = at::empty({g.n, g.c * g.kh * g.kw, g.oh * g.ow}, input.options());
  const int64_t plane_cols = g.kh * g.kw * g.oh * g.ow;
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "dpstudy_im2col_cpu", [&] {
    const scalar_t* x = input.const_data_ptr<scalar_t>();
    scalar_t* cols = columns.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, g.n * g.c, grain_for(plane_cols), [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) im2col_plane(x + p * g.h * g.w, cols + p * plane_cols, g);
    });
  });
  return columns;
}

at::Tensor col2im_cpu(const at::Tensor& columns, const ConvGeometry& g) {
  at::Tensor input = at::zeros({g.n, g.c, g.h, g.w}, columns.options());
  const at::Tensor cols_c = columns.contiguous();
  const int64_t plane_cols = g.kh * g.kw * g.oh * g.ow;
  AT_DISPATCH_FLOATING_TYPES(columns.scalar_type(), "dpstudy_col2im_cpu", [&] {
    const scalar_t* cols = cols_c.const_data_ptr<scalar_t>();
    scalar_t* x = input.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, g.n * g.c, grain_for(plane_cols), [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) col2im_plane(cols + p * plane_cols, x + p * g.h * g.w, g);
    });
  });
  return input;
}

at::Tensor conv2d_cpu(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                      at::IntArrayRef stride, at::IntArrayRef padding) {
  return conv2d_forward(input, weight, bias, stride, padding, &im2col_cpu);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> conv2d_backward_cpu(const at::Tensor& grad_output,
                                                                   const at::Tensor& input, const at::Tensor& weight,
                                                                   at::IntArrayRef stride, at::IntArrayRef padding) {
  return conv2d_backward(grad_output, input, weight, stride, padding, &im2col_cpu, &col2im_cpu);
}

}  // namespace

TORCH_LIBRARY_IMPL(dpstudy, CPU, m) {
  m.impl("conv2d", &conv2d_cpu);
  m.impl("conv2d_backward", &conv2d_backward_cpu);
}

}  // namespace dpstudy
