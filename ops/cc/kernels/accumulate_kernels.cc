// Tfcomp>MomentumAccumulate and Tfcomp>AdamAccumulate: the OpKernels (every device) and their CPU
// launchers. The element-wise math is ops/cc/lib/accumulate.h.
#include <algorithm>
#include <cstdint>

#include "ops/cc/kernels/checks.h"
#include "ops/cc/kernels/kernel_util.h"
#include "ops/cc/kernels/launchers.h"
#include "ops/cc/lib/accumulate.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tfcomp {

using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;

constexpr int64_t kAccumulateBlock = 1 << 14;

template <>
struct MomentumAccumulateLauncher<CpuDevice> {
  Status operator()(OpKernelContext* context, const AccumulateTensors& t, float mu) const {
    ParallelForBlocks(context, t.size, kAccumulateBlock, /*cost_per_element=*/4, [&](int64_t first, int64_t last) {
      MomentumAccumulateRange(first * kAccumulateBlock, std::min(t.size, last * kAccumulateBlock), t.grad,
                              t.moments[0], t.residual, mu, t.new_moments[0], t.accumulated);
    });
    return ::tensorflow::OkStatus();
  }
};

template <>
struct AdamAccumulateLauncher<CpuDevice> {
  Status operator()(OpKernelContext* context, const AccumulateTensors& t, const AdamCoefficients& constants,
                    const Tensor& m_correction, const Tensor& v_correction) const {
    AdamCoefficients c = constants;
    c.m_correction = m_correction.scalar<float>()();
    c.v_correction = v_correction.scalar<float>()();
    ParallelForBlocks(context, t.size, kAccumulateBlock, /*cost_per_element=*/16, [&](int64_t first, int64_t last) {
      AdamAccumulateRange(first * kAccumulateBlock, std::min(t.size, last * kAccumulateBlock), t.grad, t.moments[0],
                          t.moments[1], t.residual, c, t.new_moments[0], t.new_moments[1], t.accumulated);
    });
    return ::tensorflow::OkStatus();
  }
};

namespace {

// Checks grad, the moments (`moment_names`, `num_moments` inputs after grad) and the residual list
// (none or one tensor), all float32 of grad's shape, and allocates the new moments (outputs 0 to
// num_moments - 1) and `accumulated` (the next output; the new momentum itself where there is no
// residual and `accumulated_is_momentum`), filling *tensors.
Status ReadAccumulateTensors(OpKernelContext* context, const char* const* moment_names, int num_moments,
                             bool accumulated_is_momentum, AccumulateTensors* tensors) {
  const Tensor& grad = context->input(0);
  TF_RETURN_IF_ERROR(CheckIndexable(grad));
  ::tensorflow::OpInputList residuals;
  TF_RETURN_IF_ERROR(context->input_list("residual", &residuals));
  if (residuals.size() > 1) {
    return ::tensorflow::errors::InvalidArgument("residual must hold no tensor or one, got ", residuals.size());
  }
  const auto same_shape = [&](const Tensor& tensor, const char* name) -> Status {
    if (tensor.shape() != grad.shape()) {
      return ::tensorflow::errors::InvalidArgument(name, " must have the shape of grad, ", grad.shape().DebugString(),
                                                   ", got ", tensor.shape().DebugString());
    }
    return ::tensorflow::OkStatus();
  };
  tensors->size = grad.NumElements();
  tensors->grad = grad.flat<float>().data();
  for (int n = 0; n < num_moments; ++n) {
    const Tensor& moment = context->input(1 + n);
    TF_RETURN_IF_ERROR(same_shape(moment, moment_names[n]));
    tensors->moments[n] = moment.flat<float>().data();
    Tensor* out = nullptr;
    TF_RETURN_IF_ERROR(context->allocate_output(n, grad.shape(), &out));
    tensors->new_moments[n] = out->flat<float>().data();
  }
  tensors->residual = nullptr;
  if (residuals.size() == 1) {
    TF_RETURN_IF_ERROR(same_shape(residuals[0], "residual"));
    tensors->residual = residuals[0].flat<float>().data();
  }
  if (accumulated_is_momentum && tensors->residual == nullptr) {
    context->set_output(num_moments, *context->mutable_output(0));
    tensors->accumulated = nullptr;
    return ::tensorflow::OkStatus();
  }
  Tensor* accumulated = nullptr;
  TF_RETURN_IF_ERROR(context->allocate_output(num_moments, grad.shape(), &accumulated));
  tensors->accumulated = accumulated->flat<float>().data();
  return ::tensorflow::OkStatus();
}

// grad, momentum, residual (none or one): float32 of one shape; attr mu -> new_momentum, accumulated.
template <typename Device>
class MomentumAccumulateOp : public ::tensorflow::OpKernel {
 public:
  explicit MomentumAccumulateOp(::tensorflow::OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("mu", &mu_));
  }

  void Compute(OpKernelContext* context) override {
    static constexpr const char* kMoments[] = {"momentum"};
    AccumulateTensors tensors;
    OP_REQUIRES_OK(context, ReadAccumulateTensors(context, kMoments, 1, /*accumulated_is_momentum=*/true, &tensors));
    if (tensors.size == 0) return;
    OP_REQUIRES_OK(context, MomentumAccumulateLauncher<Device>()(context, tensors, mu_));
  }

 private:
  float mu_;
};

// grad, m, v, residual (none or one): float32 of one shape; m_correction, v_correction: float32
// scalars; attrs beta_1, one_minus_beta_1, beta_2, one_minus_beta_2, epsilon -> new_m, new_v, accumulated.
template <typename Device>
class AdamAccumulateOp : public ::tensorflow::OpKernel {
 public:
  explicit AdamAccumulateOp(::tensorflow::OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("beta_1", &constants_.beta_1));
    OP_REQUIRES_OK(context, context->GetAttr("one_minus_beta_1", &constants_.one_minus_beta_1));
    OP_REQUIRES_OK(context, context->GetAttr("beta_2", &constants_.beta_2));
    OP_REQUIRES_OK(context, context->GetAttr("one_minus_beta_2", &constants_.one_minus_beta_2));
    OP_REQUIRES_OK(context, context->GetAttr("epsilon", &constants_.epsilon));
  }

  void Compute(OpKernelContext* context) override {
    static constexpr const char* kMoments[] = {"m", "v"};
    const Tensor* m_correction = nullptr;
    const Tensor* v_correction = nullptr;
    OP_REQUIRES_OK(context, context->input("m_correction", &m_correction));
    OP_REQUIRES_OK(context, context->input("v_correction", &v_correction));
    OP_REQUIRES_OK(context, CheckScalar(*m_correction, "m_correction"));
    OP_REQUIRES_OK(context, CheckScalar(*v_correction, "v_correction"));
    AccumulateTensors tensors;
    OP_REQUIRES_OK(context, ReadAccumulateTensors(context, kMoments, 2, /*accumulated_is_momentum=*/false, &tensors));
    if (tensors.size == 0) return;
    OP_REQUIRES_OK(context,
                   AdamAccumulateLauncher<Device>()(context, tensors, constants_, *m_correction, *v_correction));
  }

 private:
  AdamCoefficients constants_{};
};

REGISTER_KERNEL_BUILDER(Name("Tfcomp>MomentumAccumulate").Device(::tensorflow::DEVICE_CPU),
                        MomentumAccumulateOp<CpuDevice>);
REGISTER_KERNEL_BUILDER(Name("Tfcomp>AdamAccumulate").Device(::tensorflow::DEVICE_CPU), AdamAccumulateOp<CpuDevice>);
#if TFCOMP_CUDA
REGISTER_KERNEL_BUILDER(Name("Tfcomp>MomentumAccumulate").Device(::tensorflow::DEVICE_GPU),
                        MomentumAccumulateOp<GpuDevice>);
REGISTER_KERNEL_BUILDER(Name("Tfcomp>AdamAccumulate").Device(::tensorflow::DEVICE_GPU), AdamAccumulateOp<GpuDevice>);
#endif

}  // namespace
}  // namespace tfcomp
