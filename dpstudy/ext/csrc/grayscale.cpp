// rgb_to_grayscale on CPU: one pass over the planes, parallel over pixel ranges.
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>

#include "grayscale.h"

namespace dpstudy {

at::Tensor rgb_to_grayscale_cpu(const at::Tensor& images) {
  const auto out_size = grayscale_output_size(images);
  const at::Tensor x = images.contiguous();
  at::Tensor out = at::empty(out_size, x.options());
  const int64_t plane = x.size(-2) * x.size(-1);
  const int64_t total = out.numel();
  const uint8_t* src = x.const_data_ptr<uint8_t>();
  uint8_t* dst = out.mutable_data_ptr<uint8_t>();
  // A chunk may span images; split it at image boundaries so each inner loop is a plain,
  // vectorisable loop over three contiguous input rows.
  at::parallel_for(0, total, 1 << 14, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end;) {
      const int64_t image = i / plane, offset = i % plane;
      const int64_t len = std::min(end - i, plane - offset);
      const uint8_t* r = src + image * 3 * plane + offset;
      const uint8_t* g = r + plane;
      const uint8_t* b = g + plane;
      uint8_t* o = dst + i;
      for (int64_t k = 0; k < len; ++k) o[k] = gray_pixel(r[k], g[k], b[k]);
      i += len;
    }
  });
  return out;
}

TORCH_LIBRARY_IMPL(dpstudy, CPU, m) { m.impl("rgb_to_grayscale", &rgb_to_grayscale_cpu); }

}  // namespace dpstudy
