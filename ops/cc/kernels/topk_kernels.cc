// Tfcomp>TopkCompress, exact top-k by magnitude: the OpKernel (every device) and its CPU launcher.
#include <algorithm>
#include <vector>

#include "ops/cc/kernels/checks.h"
#include "ops/cc/kernels/kernel_util.h"
#include "ops/cc/kernels/launchers.h"
#include "ops/cc/lib/sparsify.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tfcomp {

using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;

constexpr int64_t kSelectBlock = 1 << 20;

template <typename T>
struct TopkCompressLauncher<CpuDevice, T> {
  Status operator()(OpKernelContext* context, const Tensor& grad, Tensor* values, Tensor* indices) const {
    using Format = typename FormatOf<T>::type;
    const int64_t size = grad.NumElements();
    const int64_t k = values->NumElements();
    const T* grad_values = grad.flat<T>().data();
    const BitsOf<T>* g = AsBits(grad_values);

    // Each block keeps its own k best; the k best of those candidates are the k best overall.
    std::vector<std::vector<uint64_t>> candidates;
    TF_RETURN_IF_ERROR(CollectInBlocks<uint64_t>(
        context, size, kSelectBlock,
        [&](int64_t begin, int64_t end, std::vector<uint64_t>* words) {
          TopKCandidatesRange<Format>(g, begin, end, k, words);
        },
        &candidates));
    std::vector<uint64_t> words;
    TF_RETURN_IF_ERROR(HostScratch("the candidates", [&] {
      for (auto& list : candidates) {
        words.insert(words.end(), list.begin(), list.end());
        std::vector<uint64_t>().swap(list);
      }
    }));
    const int64_t kept = KeepLargest(words.data(), words.size(), k);
    // Report in increasing index order: the low 32 bits of a word are its index.
    std::sort(words.begin(), words.begin() + kept,
              [](uint64_t a, uint64_t b) { return static_cast<uint32_t>(a) < static_cast<uint32_t>(b); });

    T* out_values = values->flat<T>().data();
    int32_t* out_indices = indices->flat<int32_t>().data();
    for (int64_t j = 0; j < k; ++j) {
      const int32_t index = static_cast<int32_t>(static_cast<uint32_t>(words[j]));
      out_indices[j] = index;
      out_values[j] = grad_values[index];
    }
    return ::tensorflow::OkStatus();
  }
};

namespace {

// grad: any shape with >= k elements, T -> values [k] T, indices [k] int32 (increasing).
template <typename Device, typename T>
class TopkCompressOp : public ::tensorflow::OpKernel {
 public:
  explicit TopkCompressOp(::tensorflow::OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("k", &k_));
    OP_REQUIRES_OK(context, CheckLengthAttr("k", k_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& grad = context->input(0);
    OP_REQUIRES_OK(context, CheckIndexable(grad));
    OP_REQUIRES_OK(context, CheckTopkK(grad, k_));
    Tensor* values = nullptr;
    Tensor* indices = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, {k_}, &values));
    OP_REQUIRES_OK(context, context->allocate_output(1, {k_}, &indices));
    OP_REQUIRES_OK(context, TopkCompressLauncher<Device, T>()(context, grad, values, indices));
  }

 private:
  int64_t k_;
};

TFCOMP_REGISTER_KERNELS("Tfcomp>TopkCompress", TopkCompressOp, );

}  // namespace
}  // namespace tfcomp
