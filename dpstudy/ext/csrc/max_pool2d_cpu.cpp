// max_pool2d on CPU, parallel over (sample, channel) planes.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <cmath>

#include "max_pool2d.h"
#include "parallel.h"

namespace dpstudy {

namespace {

std::tuple<at::Tensor, at::Tensor> max_pool2d_cpu(const at::Tensor& input, at::IntArrayRef kernel_size,
                                                  at::IntArrayRef stride) {
  const PoolGeometry g = max_pool2d_geometry(input, kernel_size, stride);
  const at::Tensor x = input.contiguous();
  at::Tensor out = at::empty({input.size(0), input.size(1), g.oh, g.ow}, x.options());
  at::Tensor indices = at::empty(out.sizes(), x.options().dtype(at::kLong));
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "dpstudy_max_pool2d_cpu", [&] {
    const scalar_t* src = x.const_data_ptr<scalar_t>();
    scalar_t* dst = out.mutable_data_ptr<scalar_t>();
    int64_t* idx = indices.mutable_data_ptr<int64_t>();
    at::parallel_for(0, g.planes, grain_for(g.oh * g.ow * g.kh * g.kw), [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) {
        const scalar_t* plane = src + p * g.h * g.w;
        for (int64_t oy = 0; oy < g.oh; ++oy) {
          for (int64_t ox = 0; ox < g.ow; ++ox) {
            const int64_t y0 = oy * g.sh, x0 = ox * g.sw;
            int64_t best = y0 * g.w + x0;
            scalar_t best_value = plane[best];
            for (int64_t y = y0; y < y0 + g.kh; ++y) {
              for (int64_t xx = x0; xx < x0 + g.kw; ++xx) {
                const scalar_t v = plane[y * g.w + xx];
                if (v > best_value || std::isnan(v)) {
                  best = y * g.w + xx;
                  best_value = v;
                }
              }
            }
            const int64_t o = (p * g.oh + oy) * g.ow + ox;
            dst[o] = best_value;
            idx[o] = best;
          }
        }
      }
    });
  });
  return {out, indices};
}

at::Tensor max_pool2d_backward_cpu(const at::Tensor& grad_output, const at::Tensor& indices,
                                   at::IntArrayRef input_size) {
  const auto size = max_pool2d_backward_size(grad_output, indices, input_size);
  at::Tensor grad_input = at::zeros(size, grad_output.options());
  const at::Tensor grad = grad_output.contiguous();
  const at::Tensor idx_c = indices.contiguous();
  const int64_t planes = size[0] * size[1], in_plane = size[2] * size[3];
  const int64_t out_plane = grad.size(2) * grad.size(3);
  AT_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "dpstudy_max_pool2d_backward_cpu", [&] {
    const scalar_t* g = grad.const_data_ptr<scalar_t>();
    const int64_t* idx = idx_c.const_data_ptr<int64_t>();
    scalar_t* dst = grad_input.mutable_data_ptr<scalar_t>();
    // Overlapping windows may share a maximum, so a plane is accumulated by one task only.
    at::parallel_for(0, planes, grain_for(out_plane), [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) {
        for (int64_t o = p * out_plane; o < (p + 1) * out_plane; ++o) {
          const int64_t i = idx[o];
          TORCH_CHECK(i >= 0 && i < in_plane, "dpstudy::max_pool2d_backward: 'indices' value ", i,
                      " is outside the ", size[2], "x", size[3], " 'input_size'");
          dst[p * in_plane + i] += g[o];
        }
      }
    });
  });
  return grad_input;
}

}  // namespace

TORCH_LIBRARY_IMPL(dpstudy, CPU, m) {
  m.impl("max_pool2d", &max_pool2d_cpu);
  m.impl("max_pool2d_backward", &max_pool2d_backward_cpu);
}

}  // namespace dpstudy
