// Operator schemas of the dpstudy namespace. Kernels register per dispatch key in the other
// files (CPU here in csrc/, CUDA in csrc/cuda/); autograd and fake kernels live in ops.py.
#include <torch/library.h>

TORCH_LIBRARY(dpstudy, m) {
  // torch imports this module when it needs the fake kernels (torch.compile, FakeTensor).
  m.set_python_module("dpstudy.ext.ops");
  m.def("rgb_to_grayscale(Tensor images) -> Tensor");
  m.def("conv2d(Tensor input, Tensor weight, Tensor? bias, int[2] stride, int[2] padding) -> Tensor");
  m.def(
      "conv2d_backward(Tensor grad_output, Tensor input, Tensor weight, int[2] stride, int[2] padding)"
      " -> (Tensor grad_input, Tensor grad_weight, Tensor grad_bias)");
  m.def("max_pool2d(Tensor input, int[2] kernel_size, int[2] stride) -> (Tensor output, Tensor indices)");
  m.def("max_pool2d_backward(Tensor grad_output, Tensor indices, SymInt[2] input_size) -> Tensor");
}
