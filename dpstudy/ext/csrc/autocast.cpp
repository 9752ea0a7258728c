// Autocast (torch.autocast, precision bf16/fp16): the float operators run in float32. Their kernels
// take float32 and float64 only, and without this rule conv2d's internal at::matmul, which autocast
// re-enters, would hand max_pool2d a bf16 tensor it refuses. The pattern is the dispatcher
// tutorial's (cast the inputs, leave autocast, redispatch); it is boxed so that one function
// serves every operator, whatever its signature. Gradients flow back through the casts.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace dpstudy {
namespace {

template <c10::DispatchKey autocast_key, c10::DeviceType device>
void run_in_float32(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // On entry the stack holds exactly the arguments. cached_cast casts floating tensors on `device`
  // (not float64, not integers, not tensors elsewhere) and leaves the rest as they are.
  for (c10::IValue& arg : *stack) {
    if (arg.isTensor()) {
      arg = at::autocast::cached_cast(at::kFloat, arg.toTensor(), device);
    }
  }
  c10::impl::ExcludeDispatchKeyGuard no_autocast(autocast_key);
  op.callBoxed(stack);
}

constexpr const char* kFloatOps[] = {"conv2d", "conv2d_backward", "max_pool2d", "max_pool2d_backward"};

}  // namespace

TORCH_LIBRARY_IMPL(dpstudy, AutocastCPU, m) {
  for (const char* name : kFloatOps) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<
                     &run_in_float32<c10::DispatchKey::AutocastCPU, c10::DeviceType::CPU>>());
  }
}

TORCH_LIBRARY_IMPL(dpstudy, AutocastCUDA, m) {
  for (const char* name : kFloatOps) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<
                     &run_in_float32<c10::DispatchKey::AutocastCUDA, c10::DeviceType::CUDA>>());
  }
}

}  // namespace dpstudy
