// CPU kernel of Tfcomp>DgcCompress (004 Algorithm 3, the baseline DRAGONN replaces).
#include <vector>

#include "ops/cc/kernels/kernel_util.h"
#include "ops/cc/lib/sparsify.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tfcomp {
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;

constexpr int64_t kCollectBlock = 1 << 16;

template <typename T>
class DgcCompressOp : public OpKernel {
 public:
  explicit DgcCompressOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("max_out", &max_out_));
  }

  void Compute(OpKernelContext* context) override {
    using Format = typename FormatOf<T>::type;
    const Tensor& grad = context->input(0);
    float threshold;
    OP_REQUIRES_OK(context, ReadThreshold(context->input(1), &threshold));
    OP_REQUIRES_OK(context, CheckIndexable(grad));

    const int64_t size = grad.NumElements();
    const T* grad_values = grad.flat<T>().data();
    const BitsOf<T>* g = AsBits(grad_values);
    const BitsOf<T> threshold_key = ThresholdKey<Format>(threshold);

    // Each shard of blocks collects its selected indices in order (at most max_out); the lists are
    // then joined in order, which gives the first max_out selected indices of the tensor in one pass.
    const std::vector<std::vector<int32_t>> selected = CollectInBlocks<int32_t>(
        context, size, kCollectBlock, [&](int64_t begin, int64_t end, std::vector<int32_t>* indices) {
          DgcCollectRange<Format>(g, begin, end, threshold_key, max_out_, indices);
        });

    Tensor* values = nullptr;
    Tensor* indices = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, {max_out_}, &values));
    OP_REQUIRES_OK(context, context->allocate_output(1, {max_out_}, &indices));
    T* out_values = values->flat<T>().data();
    int32_t* out_indices = indices->flat<int32_t>().data();
    int64_t count = 0;
    for (const auto& block : selected) {
      for (int32_t index : block) {
        if (count == max_out_) break;
        out_indices[count] = index;
        out_values[count] = grad_values[index];
        ++count;
      }
    }
    std::fill(out_indices + count, out_indices + max_out_, -1);
    std::fill(out_values + count, out_values + max_out_, T(0));
  }

 private:
  int64_t max_out_;
};

#define REGISTER(T)                                                                 \
  REGISTER_KERNEL_BUILDER(                                                          \
      Name("Tfcomp>DgcCompress").Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
      DgcCompressOp<T>)
REGISTER(float);
REGISTER(Eigen::half);
REGISTER(Eigen::bfloat16);
#undef REGISTER

}  // namespace
}  // namespace tfcomp
