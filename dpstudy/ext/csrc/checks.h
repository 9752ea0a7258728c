// Argument checks shared by the CPU and CUDA kernels. Every message names the operator and the
// argument, so a bad call fails like a Python TypeError instead of crashing inside a kernel.
#pragma once

// ATen/core/Tensor.h, not ATen/ATen.h: the tensor and its methods without the declarations of
// every operator, a quarter less to compile for each source (nvcc's passes too). A source
// includes ATen/ops/<op>.h for each at:: function it calls.
#include <ATen/core/Tensor.h>

namespace dpstudy {

inline void check_dim(const at::Tensor& t, int64_t dim, const char* op, const char* name, const char* layout) {
  TORCH_CHECK(t.dim() == dim, op, ": '", name, "' must be a ", dim, "-D tensor ", layout, ", got ", t.dim(), "-D");
}

inline void check_floating(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble,
              op, ": '", name, "' must be float32 or float64, got ", t.scalar_type());
}

inline void check_like(const at::Tensor& t, const at::Tensor& ref, const char* op, const char* name, const char* ref_name) {
  TORCH_CHECK(t.device() == ref.device(), op, ": '", name, "' is on ", t.device(), " but '", ref_name, "' is on ",
              ref.device(), "; all tensors must be on one device");
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), op, ": '", name, "' has dtype ", t.scalar_type(), " but '",
              ref_name, "' has ", ref.scalar_type());
}

inline void check_pair(at::IntArrayRef v, int64_t min, const char* op, const char* name) {
  TORCH_CHECK(v.size() == 2, op, ": '", name, "' must have 2 values, got ", v.size());
  TORCH_CHECK(v[0] >= min && v[1] >= min, op, ": '", name, "' must be >= ", min, ", got ", v);
}

}  // namespace dpstudy
