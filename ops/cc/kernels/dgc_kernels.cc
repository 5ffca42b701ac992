// Tfcomp>DgcCompress (004 Algorithm 3, the baseline DRAGONN replaces): the OpKernel (every device)
// and its CPU launcher.
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

constexpr int64_t kCollectBlock = 1 << 16;

template <typename T>
struct DgcCompressLauncher<CpuDevice, T> {
  Status operator()(OpKernelContext* context, const Tensor& grad, const Tensor& threshold, Tensor* values,
                    Tensor* indices) const {
    using Format = typename FormatOf<T>::type;
    const int64_t size = grad.NumElements();
    const int64_t max_out = values->NumElements();
    const T* grad_values = grad.flat<T>().data();
    const BitsOf<T>* g = AsBits(grad_values);
    const BitsOf<T> threshold_key = ThresholdKey<Format>(threshold.scalar<float>()());

    // Each shard of blocks collects its selected indices in order (at most max_out); the lists are
    // then joined in order, which gives the first max_out selected indices of the tensor in one pass.
    std::vector<std::vector<int32_t>> selected;
    TF_RETURN_IF_ERROR(CollectInBlocks<int32_t>(
        context, size, kCollectBlock,
        [&](int64_t begin, int64_t end, std::vector<int32_t>* block_indices) {
          DgcCollectRange<Format>(g, begin, end, threshold_key, max_out, block_indices);
        },
        &selected));

    T* out_values = values->flat<T>().data();
    int32_t* out_indices = indices->flat<int32_t>().data();
    int64_t count = 0;
    for (const auto& block : selected) {
      for (int32_t index : block) {
        if (count == max_out) break;
        out_indices[count] = index;
        out_values[count] = grad_values[index];
        ++count;
      }
    }
    std::fill(out_indices + count, out_indices + max_out, -1);
    std::fill(out_values + count, out_values + max_out, T(0));
    return ::tensorflow::OkStatus();
  }
};

namespace {

// grad: any shape, T; threshold: float32 scalar -> values [max_out] T, indices [max_out] int32.
template <typename Device, typename T>
class DgcCompressOp : public ::tensorflow::OpKernel {
 public:
  explicit DgcCompressOp(::tensorflow::OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("max_out", &max_out_));
    OP_REQUIRES_OK(context, CheckLengthAttr("max_out", max_out_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& grad = context->input(0);
    const Tensor& threshold = context->input(1);
    OP_REQUIRES_OK(context, CheckThreshold(threshold, kScalarsOnHost<Device>));
    OP_REQUIRES_OK(context, CheckIndexable(grad));
    Tensor* values = nullptr;
    Tensor* indices = nullptr;
    OP_REQUIRES_OK(context, NameLengthAttr(context->allocate_output(0, {max_out_}, &values), "max_out", max_out_));
    OP_REQUIRES_OK(context, NameLengthAttr(context->allocate_output(1, {max_out_}, &indices), "max_out", max_out_));
    OP_REQUIRES_OK(context, DgcCompressLauncher<Device, T>()(context, grad, threshold, values, indices));
  }

 private:
  int64_t max_out_;
};

TFCOMP_REGISTER_KERNELS("Tfcomp>DgcCompress", DgcCompressOp, );

}  // namespace
}  // namespace tfcomp
