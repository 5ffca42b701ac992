// CPU kernel of Tfcomp>EstimateThreshold.
#include <cmath>
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

constexpr int64_t kSampleBlock = 1024;
constexpr int64_t kPrefetchDistance = 32;

template <typename T>
class EstimateThresholdOp : public OpKernel {
 public:
  explicit EstimateThresholdOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("num_samples", &num_samples_));
  }

  void Compute(OpKernelContext* context) override {
    using Format = typename FormatOf<T>::type;
    const Tensor& grad = context->input(0);
    const Tensor& ratio_tensor = context->input(1);
    const Tensor& seed_tensor = context->input(2);
    float ratio;
    OP_REQUIRES_OK(context, CheckEstimateArgs(grad, ratio_tensor, seed_tensor, &ratio));
    const int64_t size = grad.NumElements();

    const int64_t n = std::min<int64_t>(num_samples_, size);
    const int64_t k = SampleRank(ratio, n);
    const uint64_t seed = static_cast<uint64_t>(seed_tensor.scalar<int64_t>()());
    const BitsOf<T>* g = AsBits(grad.flat<T>().data());

    // Sample positions are computed a block ahead of the loads, and the loads prefetched, so that the
    // cache and TLB misses of many samples overlap.
    std::vector<BitsOf<T>> keys(n);
    ParallelForBlocks(context, n, kSampleBlock, /*cost_per_element=*/50, [&](int64_t first, int64_t last) {
      int64_t positions[kSampleBlock];
      for (int64_t block = first; block < last; ++block) {
        const int64_t begin = block * kSampleBlock;
        const int64_t count = std::min(n, begin + kSampleBlock) - begin;
        for (int64_t j = 0; j < count; ++j) {
          positions[j] = n == size ? begin + j : SamplePosition(begin + j, n, size, seed);
        }
        for (int64_t j = 0; j < count; ++j) {
          if (j + kPrefetchDistance < count) __builtin_prefetch(g + positions[j + kPrefetchDistance]);
          keys[begin + j] = MagnitudeKey<Format>(g[positions[j]]);
        }
      }
    });
    const BitsOf<T> key = KthLargestFiniteKey<Format>(keys.data(), n, k);

    Tensor* threshold = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, {}, &threshold));
    threshold->scalar<float>()() = Format::KeyToFloat(key);
  }

 private:
  int64_t num_samples_;
};

#define REGISTER(T)                                                                     \
  REGISTER_KERNEL_BUILDER(                                                              \
      Name("Tfcomp>EstimateThreshold").Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
      EstimateThresholdOp<T>)
REGISTER(float);
REGISTER(Eigen::half);
REGISTER(Eigen::bfloat16);
#undef REGISTER

}  // namespace
}  // namespace tfcomp
