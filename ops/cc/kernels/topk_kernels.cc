// CPU kernel of Tfcomp>TopkCompress: exact top-k by magnitude.
#include <algorithm>
#include <vector>

#include "ops/cc/kernels/kernel_util.h"
#include "ops/cc/lib/sparsify.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/platform/mutex.h"

namespace tfcomp {
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;

constexpr int64_t kSelectBlock = 1 << 20;

template <typename T>
class TopkCompressOp : public OpKernel {
 public:
  explicit TopkCompressOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("k", &k_));
  }

  void Compute(OpKernelContext* context) override {
    using Format = typename FormatOf<T>::type;
    const Tensor& grad = context->input(0);
    OP_REQUIRES_OK(context, CheckIndexable(grad));
    OP_REQUIRES_OK(context, CheckTopkK(grad, k_));
    const int64_t size = grad.NumElements();
    const T* grad_values = grad.flat<T>().data();
    const BitsOf<T>* g = AsBits(grad_values);

    // Each block keeps its own k best; the k best of those candidates are the k best overall.
    std::vector<std::vector<uint64_t>> candidates = CollectInBlocks<uint64_t>(
        context, size, kSelectBlock, [&](int64_t begin, int64_t end, std::vector<uint64_t>* words) {
          TopKCandidatesRange<Format>(g, begin, end, k_, words);
        });
    std::vector<uint64_t> words;
    for (auto& list : candidates) {
      words.insert(words.end(), list.begin(), list.end());
      std::vector<uint64_t>().swap(list);
    }
    const int64_t kept = KeepLargest(words.data(), words.size(), k_);
    // Report in increasing index order: the low 32 bits of a word are its index.
    std::sort(words.begin(), words.begin() + kept,
              [](uint64_t a, uint64_t b) { return static_cast<uint32_t>(a) < static_cast<uint32_t>(b); });

    Tensor* values = nullptr;
    Tensor* indices = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, {k_}, &values));
    OP_REQUIRES_OK(context, context->allocate_output(1, {k_}, &indices));
    T* out_values = values->flat<T>().data();
    int32_t* out_indices = indices->flat<int32_t>().data();
    for (int64_t j = 0; j < k_; ++j) {
      const int32_t index = static_cast<int32_t>(static_cast<uint32_t>(words[j]));
      out_indices[j] = index;
      out_values[j] = grad_values[index];
    }
  }

 private:
  int64_t k_;
};

#define REGISTER(T)                                                                  \
  REGISTER_KERNEL_BUILDER(                                                           \
      Name("Tfcomp>TopkCompress").Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
      TopkCompressOp<T>)
REGISTER(float);
REGISTER(Eigen::half);
REGISTER(Eigen::bfloat16);
#undef REGISTER

}  // namespace
}  // namespace tfcomp
