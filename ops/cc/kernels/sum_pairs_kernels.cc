// Tfcomp>SumPairs: the OpKernel and its CPU launcher.
#include <vector>

#include "ops/cc/kernels/checks.h"
#include "ops/cc/kernels/kernel_util.h"
#include "ops/cc/kernels/launchers.h"
#include "ops/cc/lib/sum_pairs.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tfcomp {

using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;

template <>
struct SumPairsLauncher<CpuDevice> {
  Status operator()(OpKernelContext* context, const Tensor& rows, int64_t max_pairs, int64_t* bad_row,
                    int32_t* bad_index) const {
    const int64_t n = rows.dim_size(0);
    const int32_t* in = rows.flat<int32_t>().data();
    *bad_row = FirstNegativeRowIndex(in, n);
    if (*bad_row >= 0) {
      *bad_index = in[2 * *bad_row];
      return ::tensorflow::OkStatus();
    }
    std::vector<uint64_t> keyed, scratch;
    std::vector<int32_t> sums;
    TF_RETURN_IF_ERROR(HostScratch("the sort of the rows", [&] {
      keyed.resize(n);
      scratch.resize(n);
      sums.resize(2 * n);
    }));
    SortRowsByIndex(in, n, keyed.data(), scratch.data());
    const int64_t distinct = SumRowsPerIndex(in, n, keyed.data(), sums.data());
    const int64_t kept = max_pairs < 0 ? distinct : std::min(distinct, max_pairs);
    Tensor* out = nullptr;
    TF_RETURN_IF_ERROR(context->allocate_output(0, {kept, 2}, &out));
    return HostScratch("the selection of the kept sums",
                       [&] { KeepSmallestKeys(sums.data(), distinct, kept, out->flat<int32_t>().data()); });
  }
};

namespace {

// rows [n, 2] int32 -> sums [m, 2] int32.
template <typename Device>
class SumPairsOp : public ::tensorflow::OpKernel {
 public:
  explicit SumPairsOp(::tensorflow::OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("max_pairs", &max_pairs_));
    OP_REQUIRES_OK(context, CheckMaxPairs(max_pairs_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& rows = context->input(0);
    OP_REQUIRES_OK(context, CheckPairRows(rows));
    int64_t bad_row = -1;
    int32_t bad_index = 0;
    OP_REQUIRES_OK(context, SumPairsLauncher<Device>()(context, rows, max_pairs_, &bad_row, &bad_index));
    OP_REQUIRES(context, bad_row < 0,
                ::tensorflow::errors::InvalidArgument("rows[", bad_row, ", 0] = ", bad_index,
                                                      " is negative (every row's index must be >= 0)"));
  }

 private:
  int64_t max_pairs_;
};

REGISTER_KERNEL_BUILDER(Name("Tfcomp>SumPairs").Device(::tensorflow::DEVICE_CPU), SumPairsOp<CpuDevice>);
#if TFCOMP_CUDA
REGISTER_KERNEL_BUILDER(Name("Tfcomp>SumPairs").Device(::tensorflow::DEVICE_GPU), SumPairsOp<GpuDevice>);
#endif

}  // namespace
}  // namespace tfcomp
