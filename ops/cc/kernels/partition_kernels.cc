// Tfcomp>HashPartition: the OpKernel and its CPU launcher.
#include "ops/cc/kernels/checks.h"
#include "ops/cc/kernels/launchers.h"
#include "ops/cc/lib/partition.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tfcomp {

using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;

template <>
struct HashPartitionLauncher<CpuDevice> {
  Status Count(OpKernelContext*, const Tensor& indices, int32_t num_parts, int32_t* counts, int64_t* bad_position,
               int32_t* bad_index) const {
    *bad_position = CountPairsPerOwner(indices.flat<int32_t>().data(), indices.NumElements(), num_parts, counts);
    if (*bad_position >= 0) *bad_index = indices.flat<int32_t>()(*bad_position);
    return ::tensorflow::OkStatus();
  }

  // counts are the owners' cursors while the rows are written, and are restored (no scratch).
  Status Write(OpKernelContext*, const Tensor& values, const Tensor& indices, int32_t num_parts, int32_t* counts,
               Tensor* rows) const {
    WriteRowsByOwner(values.flat<float>().data(), indices.flat<int32_t>().data(), indices.NumElements(), num_parts,
                     counts, rows->flat<int32_t>().data());
    return ::tensorflow::OkStatus();
  }
};

namespace {

// values [m] float32, indices [m] int32 -> rows [n, 2] int32, splits [num_parts] int32. Memory and
// time: the outputs and O(m + num_parts) on the CPU (the GPU launcher keeps per-chunk counters).
template <typename Device>
class HashPartitionOp : public ::tensorflow::OpKernel {
 public:
  explicit HashPartitionOp(::tensorflow::OpKernelConstruction* context) : OpKernel(context) {
    int64_t num_parts = 0;
    OP_REQUIRES_OK(context, context->GetAttr("num_parts", &num_parts));
    OP_REQUIRES_OK(context, CheckNumParts(num_parts));
    num_parts_ = static_cast<int32_t>(num_parts);
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& values = context->input(0);
    const Tensor& indices = context->input(1);
    OP_REQUIRES_OK(context, CheckDecodePairs(values, indices));
    OP_REQUIRES_OK(context, CheckPartitionPairs(indices));
    Tensor* splits = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(1, {num_parts_}, &splits));
    int32_t* counts = splits->flat<int32_t>().data();
    int64_t bad_position = -1;
    int32_t bad_index = 0;
    const HashPartitionLauncher<Device> launcher;
    OP_REQUIRES_OK(context, launcher.Count(context, indices, num_parts_, counts, &bad_position, &bad_index));
    OP_REQUIRES(context, bad_position < 0,
                ::tensorflow::errors::InvalidArgument("indices[", bad_position, "] = ", bad_index,
                                                      " is negative (valid: -1 for an empty slot, or >= 0)"));
    int64_t total = 0;
    for (int32_t p = 0; p < num_parts_; ++p) total += counts[p];
    Tensor* rows = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, {total, 2}, &rows));
    OP_REQUIRES_OK(context, launcher.Write(context, values, indices, num_parts_, counts, rows));
  }

 private:
  int32_t num_parts_;
};

REGISTER_KERNEL_BUILDER(Name("Tfcomp>HashPartition").Device(::tensorflow::DEVICE_CPU), HashPartitionOp<CpuDevice>);
#if TFCOMP_CUDA
// The splits are in host memory, where Horovod's alltoall reads them.
REGISTER_KERNEL_BUILDER(Name("Tfcomp>HashPartition").Device(::tensorflow::DEVICE_GPU).HostMemory("splits"),
                        HashPartitionOp<GpuDevice>);
#endif

}  // namespace
}  // namespace tfcomp
