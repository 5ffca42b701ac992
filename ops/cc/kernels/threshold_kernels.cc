// Tfcomp>EstimateThreshold: the OpKernel (every device) and its CPU launcher.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "ops/cc/kernels/checks.h"
#include "ops/cc/kernels/kernel_util.h"
#include "ops/cc/kernels/launchers.h"
#include "ops/cc/lib/hashing.h"
#include "ops/cc/lib/sparsify.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tfcomp {

using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;

constexpr int64_t kSampleBlock = 1024;
constexpr int64_t kPrefetchDistance = 32;

template <typename T>
struct EstimateThresholdLauncher<CpuDevice, T> {
  Status operator()(OpKernelContext* context, const Tensor& grad, const Tensor* addend, int64_t n, int64_t k,
                    const Tensor& seed_tensor, Tensor* threshold) const {
    using Format = typename FormatOf<T>::type;
    const int64_t size = grad.NumElements();
    const uint64_t seed = static_cast<uint64_t>(seed_tensor.scalar<int64_t>()());
    const BitsOf<T>* g = AsBits(grad.flat<T>().data());
    // CheckAddend: only float32 has an addend.
    const uint32_t* r = addend == nullptr ? nullptr : AsBits(addend->flat<float>().data());

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
          if (j + kPrefetchDistance < count) {
            __builtin_prefetch(g + positions[j + kPrefetchDistance]);
            if (r != nullptr) __builtin_prefetch(r + positions[j + kPrefetchDistance]);
          }
          BitsOf<T> bits = g[positions[j]];
          if constexpr (std::is_same<T, float>::value) {
            if (r != nullptr) bits = SumBits(bits, r[positions[j]]);
          }
          keys[begin + j] = MagnitudeKey<Format>(bits);
        }
      }
    });
    threshold->scalar<float>()() = Format::KeyToFloat(KthLargestFiniteKey<Format>(keys.data(), n, k));
    return ::tensorflow::OkStatus();
  }
};

namespace {

// grad: any non-empty shape, T; ratio: float32 scalar in (0, 1] (host memory); seed: int64 scalar;
// addend: zero or one tensor of grad's shape (float32) -> threshold: float32 scalar.
template <typename Device, typename T>
class EstimateThresholdOp : public ::tensorflow::OpKernel {
 public:
  explicit EstimateThresholdOp(::tensorflow::OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("num_samples", &num_samples_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& grad = context->input(0);
    const Tensor& seed = context->input(2);
    float ratio = 0.0f;
    OP_REQUIRES_OK(context, CheckEstimateArgs(grad, context->input(1), seed, &ratio));
    const Tensor* addend = nullptr;
    OP_REQUIRES_OK(context, OptionalAddend(context, grad, "grad", &addend));
    const int64_t n = std::min<int64_t>(num_samples_, grad.NumElements());
    Tensor* threshold = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, {}, &threshold));
    OP_REQUIRES_OK(context, EstimateThresholdLauncher<Device, T>()(context, grad, addend, n, SampleRank(ratio, n), seed, threshold));
  }

 private:
  int64_t num_samples_;
};

TFCOMP_REGISTER_KERNELS("Tfcomp>EstimateThreshold", EstimateThresholdOp, .HostMemory("ratio"));

}  // namespace
}  // namespace tfcomp
