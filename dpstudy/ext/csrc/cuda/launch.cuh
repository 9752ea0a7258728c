// Launch shape shared by the CUDA kernels: 256 threads, grid-stride loops over 64-bit indices.
#pragma once

#include <algorithm>
#include <cstdint>

namespace dpstudy {

constexpr int kThreads = 256;

// Enough blocks to cover `total` once, capped; the grid-stride loop covers the rest.
inline unsigned int blocks_for(int64_t total) {
  return static_cast<unsigned int>(std::min<int64_t>((total + kThreads - 1) / kThreads, int64_t{1} << 20));
}

#define DPSTUDY_CUDA_KERNEL_LOOP(i, total)                                                        \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (total); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

}  // namespace dpstudy
