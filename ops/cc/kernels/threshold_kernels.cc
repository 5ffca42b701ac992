// Tfcomp>EstimateThreshold: the OpKernel (every device) and its CPU launcher.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "ops/cc/kernels/checks.h"
#include "ops/cc/kernels/kernel_util.h"
#include "ops/cc/kernels/launchers.h"
#include "ops/cc/lib/hashing.h"
#include "ops/cc/lib/parts.h"
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
  Status operator()(OpKernelContext* context, const Parts<T>& parts, int64_t total, int64_t n, int64_t k,
                    const Tensor& seed_tensor, Tensor* threshold) const {
    using Format = typename FormatOf<T>::type;
    const uint64_t seed = static_cast<uint64_t>(seed_tensor.scalar<int64_t>()());
    const int num_parts = static_cast<int>(parts.size());

    // Sample positions (in the parts' joint index space) are computed a block ahead of the loads and
    // mapped to their part, and the loads prefetched, so that the cache and TLB misses of many
    // samples overlap. Positions increase within a block, so the part only moves forward.
    std::vector<BitsOf<T>> keys;
    TF_RETURN_IF_ERROR(HostScratch("the samples", [&] { keys.resize(n); }));
    ParallelForBlocks(context, n, kSampleBlock, /*cost_per_element=*/50, [&](int64_t first, int64_t last) {
      const BitsOf<T>* grads[kSampleBlock];
      const BitsOf<T>* addends[kSampleBlock];
      for (int64_t block = first; block < last; ++block) {
        const int64_t begin = block * kSampleBlock;
        const int64_t count = std::min(n, begin + kSampleBlock) - begin;
        int p = -1;
        for (int64_t j = 0; j < count; ++j) {
          const int64_t position = n == total ? begin + j : SamplePosition(begin + j, n, total, seed);
          if (p < 0) p = PartAt(parts.data(), num_parts, position);
          while (position >= parts[p].offset + parts[p].size) ++p;
          const int64_t local = position - parts[p].offset;
          grads[j] = parts[p].grad + local;
          addends[j] = parts[p].addend == nullptr ? nullptr : parts[p].addend + local;
        }
        for (int64_t j = 0; j < count; ++j) {
          if (j + kPrefetchDistance < count) {
            __builtin_prefetch(grads[j + kPrefetchDistance]);
            if (addends[j + kPrefetchDistance] != nullptr) __builtin_prefetch(addends[j + kPrefetchDistance]);
          }
          BitsOf<T> bits = *grads[j];
          if constexpr (std::is_same<T, float>::value) {  // CheckGradParts: only float32 has an addend
            if (addends[j] != nullptr) bits = SumBits(bits, *addends[j]);
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

// grad: M >= 1 tensors of any shapes, T, not all empty (the gradient is their concatenation); ratio:
// float32 scalar in (0, 1] (host memory); seed: int64 scalar; addend: none, or one float32 tensor
// per grad tensor of its shape -> threshold: float32 scalar.
template <typename Device, typename T>
class EstimateThresholdOp : public ::tensorflow::OpKernel {
 public:
  explicit EstimateThresholdOp(::tensorflow::OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("num_samples", &num_samples_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor* ratio_tensor = nullptr;
    const Tensor* seed = nullptr;
    OP_REQUIRES_OK(context, context->input("ratio", &ratio_tensor));
    OP_REQUIRES_OK(context, context->input("seed", &seed));
    ::tensorflow::OpInputList grads;
    OP_REQUIRES_OK(context, context->input_list("grad", &grads));
    float ratio = 0.0f;
    OP_REQUIRES_OK(context, CheckEstimateArgs(grads, *ratio_tensor, *seed, &ratio));
    Parts<T> parts;
    int64_t total = 0;
    OP_REQUIRES_OK(context, ReadGradientParts<T>(context, nullptr, &parts, &total));
    const int64_t n = std::min<int64_t>(num_samples_, total);
    Tensor* threshold = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, {}, &threshold));
    OP_REQUIRES_OK(context, EstimateThresholdLauncher<Device, T>()(context, parts, total, n, SampleRank(ratio, n),
                                                                   *seed, threshold));
  }

 private:
  int64_t num_samples_;
};

TFCOMP_REGISTER_KERNELS("Tfcomp>EstimateThreshold", EstimateThresholdOp, .HostMemory("ratio"));

}  // namespace
}  // namespace tfcomp
