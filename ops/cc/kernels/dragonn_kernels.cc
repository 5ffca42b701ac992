// CPU kernel of Tfcomp>DragonnCompress (004 Algorithm 1).
#include "ops/cc/kernels/kernel_util.h"
#include "ops/cc/lib/hashing.h"
#include "ops/cc/lib/sparsify.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tfcomp {
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;

constexpr int64_t kHashBlock = 1 << 16;

template <typename T>
class DragonnCompressOp : public OpKernel {
 public:
  explicit DragonnCompressOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("num_slots", &num_slots_));
    OP_REQUIRES(context, num_slots_ <= std::numeric_limits<int32_t>::max(),
                ::tensorflow::errors::InvalidArgument("num_slots must be < 2^31, got ", num_slots_));
  }

  void Compute(OpKernelContext* context) override {
    using Format = typename FormatOf<T>::type;
    const Tensor& grad = context->input(0);
    float threshold;
    OP_REQUIRES_OK(context, ReadThreshold(context->input(1), &threshold));
    const Tensor& seed_tensor = context->input(2);
    OP_REQUIRES_OK(context, CheckScalar(seed_tensor, "seed"));
    OP_REQUIRES_OK(context, CheckIndexable(grad));

    const int64_t size = grad.NumElements();
    const T* grad_values = grad.flat<T>().data();
    const BitsOf<T>* g = AsBits(grad_values);
    const BitsOf<T> threshold_key = ThresholdKey<T>(threshold);
    const SlotHash hash =
        SlotHash::FromSeed(static_cast<uint64_t>(seed_tensor.scalar<int64_t>()()), static_cast<uint32_t>(num_slots_));

    Tensor slots_tensor;
    OP_REQUIRES_OK(context, context->allocate_temp(::tensorflow::DT_UINT64, {num_slots_}, &slots_tensor));
    uint64_t* slots = reinterpret_cast<uint64_t*>(slots_tensor.flat<::tensorflow::uint64>().data());
    std::fill(slots, slots + num_slots_, 0);

    ParallelForBlocks(context, size, kHashBlock, /*cost_per_element=*/1, [&](int64_t first, int64_t last) {
      DragonnHashRange<Format>(g, first * kHashBlock, std::min(size, last * kHashBlock), threshold_key, hash, slots);
    });

    Tensor* values = nullptr;
    Tensor* indices = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, {num_slots_}, &values));
    OP_REQUIRES_OK(context, context->allocate_output(1, {num_slots_}, &indices));
    T* out_values = values->flat<T>().data();
    int32_t* out_indices = indices->flat<int32_t>().data();
    for (int64_t s = 0; s < num_slots_; ++s) {
      const int32_t index = SlotIndex(slots[s]);
      out_indices[s] = index;
      out_values[s] = index < 0 ? T(0) : grad_values[index];
    }
  }

 private:
  int64_t num_slots_;
};

#define REGISTER(T)                                                                    \
  REGISTER_KERNEL_BUILDER(                                                             \
      Name("Tfcomp>DragonnCompress").Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
      DragonnCompressOp<T>)
REGISTER(float);
REGISTER(Eigen::half);
REGISTER(Eigen::bfloat16);
#undef REGISTER

}  // namespace
}  // namespace tfcomp
