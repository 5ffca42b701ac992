// Tfcomp>DragonnCompress (004 Algorithm 1): the OpKernel (every device) and its CPU launcher.
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

constexpr int64_t kHashBlock = 1 << 16;

template <typename T>
struct DragonnCompressLauncher<CpuDevice, T> {
  Status operator()(OpKernelContext* context, const Parts<T>& parts, int64_t total, const Tensor& threshold,
                    const Tensor& seed, Tensor* values, Tensor* indices, DragonnScratch* /*kept*/) const {
    using Format = typename FormatOf<T>::type;
    const int64_t num_slots = values->NumElements();
    const BitsOf<T> threshold_key = ThresholdKey<Format>(threshold.scalar<float>()());
    const SlotHash hash =
        SlotHash::FromSeed(static_cast<uint64_t>(seed.scalar<int64_t>()()), static_cast<uint32_t>(num_slots));

    // Phase 1, one pass over the gradient's parts: every block of the parts' joint index space lists
    // the slot words of its selected elements (no shared writes, so nothing stalls the streaming
    // read). Phase 2: each thread owns a range of slots and keeps the largest word hashed into each
    // of its slots.
    std::vector<std::vector<uint64_t>> word_lists;
    TF_RETURN_IF_ERROR(CollectInBlocks<uint64_t>(
        context, total, kHashBlock, [&](int64_t begin, int64_t end, std::vector<uint64_t>* words) {
          for (int p = PartAt(parts.data(), static_cast<int>(parts.size()), begin);
               p < static_cast<int>(parts.size()) && parts[p].offset < end; ++p) {
            const GradientPart<BitsOf<T>>& part = parts[p];
            const int64_t first = std::max(begin, part.offset) - part.offset;
            const int64_t last = std::min(end, part.offset + part.size) - part.offset;
            if constexpr (std::is_same<T, float>::value) {  // CheckGradParts: only float32 has an addend
              if (part.addend != nullptr) {
                DragonnCollectRangeSum(part.grad, part.addend, part.sum, first, last, threshold_key, words,
                                       part.offset);
                continue;
              }
            }
            DragonnCollectRange<Format>(part.grad, first, last, threshold_key, words, part.offset);
          }
        },
        &word_lists));
    int64_t num_words = 0;
    for (const auto& words : word_lists) num_words += words.size();

    Tensor slots_tensor;
    TF_RETURN_IF_ERROR(NameLengthAttr(context->allocate_temp(::tensorflow::DT_UINT64, {num_slots}, &slots_tensor),
                                      "num_slots", num_slots));
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

// grad: M >= 1 tensors of any shapes, T (the gradient is their concatenation); threshold: float32
// scalar; seed: int64 scalar; addend: none, or one float32 tensor per grad tensor of its shape ->
// values [num_slots] T, indices [num_slots] int32, sum: one tensor per addend, grad + addend.
template <typename Device, typename T>
class DragonnCompressOp : public ::tensorflow::OpKernel {
 public:
  explicit DragonnCompressOp(::tensorflow::OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("num_slots", &num_slots_));
    OP_REQUIRES_OK(context, CheckLengthAttr("num_slots", num_slots_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor* threshold = nullptr;
    const Tensor* seed = nullptr;
    OP_REQUIRES_OK(context, context->input("threshold", &threshold));
    OP_REQUIRES_OK(context, context->input("seed", &seed));
    OP_REQUIRES_OK(context, CheckThreshold(*threshold, kScalarsOnHost<Device>));
    OP_REQUIRES_OK(context, CheckScalar(*seed, "seed"));
    Parts<T> parts;
    int64_t total = 0;
    OP_REQUIRES_OK(context, ReadGradientParts<T>(context, "sum", &parts, &total));
    Tensor* values = nullptr;
    Tensor* indices = nullptr;
    OP_REQUIRES_OK(context, NameLengthAttr(context->allocate_output("values", {num_slots_}, &values), "num_slots",
                                           num_slots_));
    OP_REQUIRES_OK(context, NameLengthAttr(context->allocate_output("indices", {num_slots_}, &indices), "num_slots",
                                           num_slots_));
    OP_REQUIRES_OK(context,
                   DragonnCompressLauncher<Device, T>()(context, parts, total, *threshold, *seed, values, indices,
                                                        &kept_scratch_));
  }

 private:
  int64_t num_slots_;
  DragonnScratch kept_scratch_;
};

TFCOMP_REGISTER_KERNELS("Tfcomp>DragonnCompress", DragonnCompressOp, );

}  // namespace
}  // namespace tfcomp
