// Tfcomp>ZeroAt: the OpKernel (every device) and its CPU launcher.
#include <algorithm>

#include "ops/cc/kernels/launchers.h"
#include "ops/cc/lib/zero_at.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"

namespace tfcomp {

using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;

template <>
struct ZeroAtLauncher<CpuDevice> {
  Status operator()(OpKernelContext* context, const Tensor& indices, int64_t offset, const Tensor* source,
                    Tensor* data) const {
    float* out = data->flat<float>().data();
    if (source != nullptr) {
      const float* in = source->flat<float>().data();
      std::copy(in, in + source->NumElements(), out);
    }
    ZeroAt(out, data->NumElements(), indices.flat<int32_t>().data(), indices.NumElements(), offset);
    return ::tensorflow::OkStatus();
  }
};

namespace {

// variable: resource of a float32 variable; indices: [n] int32. Clears in place (see the op's doc).
template <typename Device>
class ZeroAtOp : public ::tensorflow::OpKernel {
 public:
  explicit ZeroAtOp(::tensorflow::OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("offset", &offset_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& indices = context->input(1);
    OP_REQUIRES(context, indices.dims() == 1,
                ::tensorflow::errors::InvalidArgument("indices must be a vector, got shape ",
                                                      indices.shape().DebugString()));
    ::tensorflow::core::RefCountPtr<::tensorflow::Var> variable;
    OP_REQUIRES_OK(context, ::tensorflow::LookupResource(context, ::tensorflow::HandleFromInput(context, 0), &variable));
    ::tensorflow::mutex_lock lock(*variable->mu());
    Tensor* data = variable->tensor();
    OP_REQUIRES(context, variable->is_initialized,
                ::tensorflow::errors::FailedPrecondition("variable must be initialized before zero_at"));
    OP_REQUIRES(context, data->dtype() == ::tensorflow::DT_FLOAT,
                ::tensorflow::errors::InvalidArgument("variable must be float32, got ",
                                                      ::tensorflow::DataTypeString(data->dtype())));
    if (data->RefCountIsOne()) {
      OP_REQUIRES_OK(context, ZeroAtLauncher<Device>()(context, indices, offset_, nullptr, data));
      return;
    }
    // Another tensor (a read of the variable still alive) shares the buffer: write a copy instead.
    ::tensorflow::AllocatorAttributes attributes;
    attributes.set_gpu_compatible(true);
    attributes.set_nic_compatible(true);
    Tensor copy;
    OP_REQUIRES_OK(context, context->allocate_temp(::tensorflow::DT_FLOAT, data->shape(), &copy, attributes));
    OP_REQUIRES_OK(context, ZeroAtLauncher<Device>()(context, indices, offset_, data, &copy));
    *data = copy;
  }

 private:
  int64_t offset_;
};

REGISTER_KERNEL_BUILDER(Name("Tfcomp>ZeroAt").Device(::tensorflow::DEVICE_CPU), ZeroAtOp<CpuDevice>);
#if TFCOMP_CUDA
REGISTER_KERNEL_BUILDER(Name("Tfcomp>ZeroAt").Device(::tensorflow::DEVICE_GPU).HostMemory("variable"),
                        ZeroAtOp<GpuDevice>);
#endif

}  // namespace
}  // namespace tfcomp
