// Tfcomp>DragonnCompress (004 Algorithm 1): the OpKernel (every device) and its CPU launcher.
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

constexpr int64_t kHashBlock = 1 << 16;

template <typename T>
struct DragonnCompressLauncher<CpuDevice, T> {
  Status operator()(OpKernelContext* context, const Tensor& grad, const Tensor* addend, const Tensor& threshold,
                    const Tensor& seed, Tensor* values, Tensor* indices, Tensor* sum) const {
    using Format = typename FormatOf<T>::type;
    const int64_t size = grad.NumElements();
    const int64_t num_slots = values->NumElements();
    const BitsOf<T>* g = AsBits(grad.flat<T>().data());
    const BitsOf<T> threshold_key = ThresholdKey<Format>(threshold.scalar<float>()());
    const SlotHash hash =
        SlotHash::FromSeed(static_cast<uint64_t>(seed.scalar<int64_t>()()), static_cast<uint32_t>(num_slots));

    // Phase 1, one pass over grad: every block lists the slot words of its selected elements (no
    // shared writes, so nothing stalls the streaming read). Phase 2: each thread owns a range of
    // slots and keeps the largest word hashed into each of its slots.
    const std::vector<std::vector<uint64_t>> word_lists = CollectInBlocks<uint64_t>(
        context, size, kHashBlock, [&](int64_t begin, int64_t end, std::vector<uint64_t>* words) {
          if constexpr (std::is_same<T, float>::value) {  // CheckAddend: only float32 has one
            if (addend != nullptr) {
              DragonnCollectRangeSum(g, AsBits(addend->flat<float>().data()), MutableBits<float>(sum), begin, end,
                                     threshold_key, words);
              return;
            }
          }
          DragonnCollectRange<Format>(g, begin, end, threshold_key, words);
        });
    int64_t num_words = 0;
    for (const auto& words : word_lists) num_words += words.size();

    Tensor slots_tensor;
    TF_RETURN_IF_ERROR(context->allocate_temp(::tensorflow::DT_UINT64, {num_slots}, &slots_tensor));
    uint64_t* slots = reinterpret_cast<uint64_t*>(slots_tensor.flat<::tensorflow::uint64>().data());
    std::fill(slots, slots + num_slots, 0);
    const int64_t owners = std::max<int64_t>(1, std::min<int64_t>(NumCpuThreads(context), num_slots / 1024));
    ParallelForBlocks(context, owners, 1, num_words * 4, [&](int64_t first, int64_t last) {
      for (int64_t owner = first; owner < last; ++owner) {
        for (const auto& words : word_lists) {
          DragonnFillSlots(words.data(), words.size(), hash, static_cast<uint32_t>(owner * num_slots / owners),
                           static_cast<uint32_t>((owner + 1) * num_slots / owners), slots);
        }
      }
    });

    BitsOf<T>* out_values = MutableBits<T>(values);
    int32_t* out_indices = indices->flat<int32_t>().data();
    for (int64_t s = 0; s < num_slots; ++s) {
      out_indices[s] = SlotIndex(slots[s]);
      out_values[s] = SlotValueBits<Format>(slots[s]);
    }
    return ::tensorflow::OkStatus();
  }
};

namespace {

// grad: any shape, T; threshold: float32 scalar; seed: int64 scalar; addend: zero or one tensor of
// grad's shape (float32) -> values [num_slots] T, indices [num_slots] int32, sum: as many tensors as
// addends, grad + addend.
template <typename Device, typename T>
class DragonnCompressOp : public ::tensorflow::OpKernel {
 public:
  explicit DragonnCompressOp(::tensorflow::OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("num_slots", &num_slots_));
    OP_REQUIRES_OK(context, CheckLengthAttr("num_slots", num_slots_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& grad = context->input(0);
    const Tensor& threshold = context->input(1);
    const Tensor& seed = context->input(2);
    OP_REQUIRES_OK(context, CheckThreshold(threshold, kScalarsOnHost<Device>));
    OP_REQUIRES_OK(context, CheckScalar(seed, "seed"));
    OP_REQUIRES_OK(context, CheckIndexable(grad));
    const Tensor* addend = nullptr;
    OP_REQUIRES_OK(context, OptionalAddend(context, grad, "grad", &addend));
    Tensor* values = nullptr;
    Tensor* indices = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, {num_slots_}, &values));
    OP_REQUIRES_OK(context, context->allocate_output(1, {num_slots_}, &indices));
    Tensor* sum = nullptr;
    if (addend != nullptr) {
      ::tensorflow::OpOutputList sums;
      OP_REQUIRES_OK(context, context->output_list("sum", &sums));
      OP_REQUIRES_OK(context, sums.allocate(0, grad.shape(), &sum));
    }
    OP_REQUIRES_OK(context, DragonnCompressLauncher<Device, T>()(context, grad, addend, threshold, seed, values, indices, sum));
  }

 private:
  int64_t num_slots_;
};

TFCOMP_REGISTER_KERNELS("Tfcomp>DragonnCompress", DragonnCompressOp, );

}  // namespace
}  // namespace tfcomp
