// CPU kernel of Tfcomp>DragonnCompress (004 Algorithm 1).
#include <vector>

#include "ops/cc/kernels/kernel_util.h"
#include "ops/cc/lib/hashing.h"
#include "ops/cc/lib/sparsify.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tfcomp {
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;

constexpr int64_t kHashBlock = 1 << 16;

template <typename T>
class DragonnCompressOp : public OpKernel {
 public:
  explicit DragonnCompressOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("num_slots", &num_slots_));
    OP_REQUIRES(context, num_slots_ <= std::numeric_limits<int32_t>::max(),
                ::tensorflow::errors::InvalidArgument("num_slots must be < 2^31, got ", num_slots_));
  }

  void Compute(OpKernelContext* context) override {
    using Format = typename FormatOf<T>::type;
    const Tensor& grad = context->input(0);
    float threshold;
    OP_REQUIRES_OK(context, ReadThreshold(context->input(1), &threshold));
    const Tensor& seed_tensor = context->input(2);
    OP_REQUIRES_OK(context, CheckScalar(seed_tensor, "seed"));
    OP_REQUIRES_OK(context, CheckIndexable(grad));

    const int64_t size = grad.NumElements();
    const BitsOf<T>* g = AsBits(grad.flat<T>().data());
    const BitsOf<T> threshold_key = ThresholdKey<Format>(threshold);
    const SlotHash hash =
        SlotHash::FromSeed(static_cast<uint64_t>(seed_tensor.scalar<int64_t>()()), static_cast<uint32_t>(num_slots_));

    // Phase 1, one pass over grad: every block lists the slot words of its selected elements (no
    // shared writes, so nothing stalls the streaming read). Phase 2: each thread owns a range of
    // slots and keeps the largest word hashed into each of its slots.
    const std::vector<std::vector<uint64_t>> word_lists = CollectInBlocks<uint64_t>(
        context, size, kHashBlock, [&](int64_t begin, int64_t end, std::vector<uint64_t>* words) {
          DragonnCollectRange<Format>(g, begin, end, threshold_key, words);
        });
    int64_t num_words = 0;
    for (const auto& words : word_lists) num_words += words.size();

    Tensor slots_tensor;
    OP_REQUIRES_OK(context, context->allocate_temp(::tensorflow::DT_UINT64, {num_slots_}, &slots_tensor));
    uint64_t* slots = reinterpret_cast<uint64_t*>(slots_tensor.flat<::tensorflow::uint64>().data());
    std::fill(slots, slots + num_slots_, 0);
    const int64_t owners = std::max<int64_t>(1, std::min<int64_t>(NumCpuThreads(context), num_slots_ / 1024));
    ParallelForBlocks(context, owners, 1, num_words * 4, [&](int64_t first, int64_t last) {
      for (int64_t owner = first; owner < last; ++owner) {
        for (const auto& words : word_lists) {
          DragonnFillSlots(words.data(), words.size(), hash, static_cast<uint32_t>(owner * num_slots_ / owners),
                           static_cast<uint32_t>((owner + 1) * num_slots_ / owners), slots);
        }
      }
    });

    Tensor* values = nullptr;
    Tensor* indices = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, {num_slots_}, &values));
    OP_REQUIRES_OK(context, context->allocate_output(1, {num_slots_}, &indices));
    BitsOf<T>* out_values = reinterpret_cast<BitsOf<T>*>(values->flat<T>().data());
    int32_t* out_indices = indices->flat<int32_t>().data();
    for (int64_t s = 0; s < num_slots_; ++s) {
      out_indices[s] = SlotIndex(slots[s]);
      out_values[s] = SlotValueBits<Format>(slots[s]);
    }
  }

 private:
  int64_t num_slots_;
};

#define REGISTER(T)                                                                    \
  REGISTER_KERNEL_BUILDER(                                                             \
      Name("Tfcomp>DragonnCompress").Device(::tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
      DragonnCompressOp<T>)
REGISTER(float);
REGISTER(Eigen::half);
REGISTER(Eigen::bfloat16);
#undef REGISTER

}  // namespace
}  // namespace tfcomp
