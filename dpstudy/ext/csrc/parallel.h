// Grain size for at::parallel_for over planes.
#pragma once

#include <algorithm>
#include <cstdint>

namespace dpstudy {

// Planes per task such that a task does at least ~32k element operations: waking OpenMP threads
// costs microseconds, so small tensors (gradcheck, the last layers) run inline on one thread.
inline int64_t grain_for(int64_t work_per_plane) {
  return std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, work_per_plane));
}

}  // namespace dpstudy
