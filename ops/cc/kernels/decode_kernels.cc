// CPU kernel of Tfcomp>SparseBatchedDecode (004 Sec. 4.3).
#include "ops/cc/kernels/kernel_util.h"
#include "ops/cc/lib/decode.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tfcomp {
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShapeUtils;
namespace errors = ::tensorflow::errors;

template <typename T>
class SparseBatchedDecodeOp : public OpKernel {
 public:
  explicit SparseBatchedDecodeOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("size", &size_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& values = context->input(0);
    const Tensor& indices = context->input(1);
    OP_REQUIRES(context, TensorShapeUtils::IsVector(values.shape()),
                errors::InvalidArgument("values must be a vector, got shape ", values.shape().DebugString()));
    OP_REQUIRES(context, TensorShapeUtils::IsVector(indices.shape()),
                errors::InvalidArgument("indices must be a vector, got shape ", indices.shape().DebugString()));
    OP_REQUIRES(context, values.NumElements() == indices.NumElements(),
                errors::InvalidArgument("values and indices must have the same length, got values of shape ",
                                        values.shape().DebugString(), " and indices of shape ",
                                        indices.shape().DebugString()));
    const int64_t n = values.NumElements();
    const T* pair_values = values.flat<T>().data();
    const int32_t* pair_indices = indices.flat<int32_t>().data();
    const int64_t bad = FirstInvalidIndex(pair_indices, n, size_);
    OP_REQUIRES(context, bad < 0,
                errors::InvalidArgument("indices[", bad, "] = ", bad < 0 ? 0 : pair_indices[bad],
                                        " is out of range for size ", size_, " (valid: -1 to ", size_ - 1, ")"));

    Tensor* dense = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, {size_}, &dense));
    T* out = dense->flat<T>().data();
    // Each thread owns a contiguous range of the output: no races, and every element receives its
    // additions in pair order, so the result is deterministic.
    const int64_t owners = std::max<int64_t>(1, std::min<int64_t>(NumCpuThreads(context), size_ / 4096));
    ParallelForBlocks(context, owners, /*block_size=*/1, /*cost_per_element=*/size_ + n,
                      [&](int64_t first, int64_t last) {
                        for (int64_t owner = first; owner < last; ++owner) {
                          ScatterAddOwnedRange(pair_values, pair_indices, n, owner * size_ / owners,
                                               (owner + 1) * size_ / owners, out);
                        }
                      });
  }

 private:
  int64_t size_;
};

#define REGISTER(T)                                                                         \
  REGISTER_KERNEL_BUILDER(                                                                  \
      Name("Tfcomp>SparseBatchedDecode").Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
      SparseBatchedDecodeOp<T>)
REGISTER(float);
REGISTER(Eigen::half);
REGISTER(Eigen::bfloat16);
#undef REGISTER

}  // namespace
}  // namespace tfcomp
