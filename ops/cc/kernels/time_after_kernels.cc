// Tfcomp>TimeAfter: the time once its inputs are computed (every device; the inputs are not read).
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/platform/env_time.h"

namespace tfcomp {
namespace {

class TimeAfterOp : public ::tensorflow::OpKernel {
 public:
  explicit TimeAfterOp(::tensorflow::OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(::tensorflow::OpKernelContext* context) override {
    const double seconds = static_cast<double>(::tensorflow::EnvTime::NowNanos()) / 1e9;
    ::tensorflow::Tensor* out = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, ::tensorflow::TensorShape({}), &out));
    out->scalar<double>()() = seconds;
  }

  // One clock read: run inline, not queued behind the thread pool's other work.
  bool IsExpensive() override { return false; }
};

REGISTER_KERNEL_BUILDER(Name("Tfcomp>TimeAfter").Device(::tensorflow::DEVICE_CPU), TimeAfterOp);
#if TFCOMP_CUDA
REGISTER_KERNEL_BUILDER(Name("Tfcomp>TimeAfter").Device(::tensorflow::DEVICE_GPU).HostMemory("seconds"), TimeAfterOp);
#endif

}  // namespace
}  // namespace tfcomp
