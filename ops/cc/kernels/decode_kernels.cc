// Tfcomp>SparseBatchedDecode (004 Sec. 4.3): the OpKernel (every device) and its CPU launcher.
#include <algorithm>
#include <vector>

#include "ops/cc/kernels/checks.h"
#include "ops/cc/kernels/kernel_util.h"
#include "ops/cc/kernels/launchers.h"
#include "ops/cc/lib/decode.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tfcomp {

using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;

template <typename T>
struct SparseBatchedDecodeLauncher<CpuDevice, T> {
  Status operator()(OpKernelContext* context, const Tensor& values, const Tensor& indices, Tensor* dense,
                    int64_t* bad_position, int32_t* bad_index) const {
    const int64_t n = values.NumElements();
    const int64_t size = dense->NumElements();
    const T* pair_values = values.flat<T>().data();
    const int32_t* pair_indices = indices.flat<int32_t>().data();
    const int64_t num_chunks = NumDecodeChunks(size);

    // 1. Each range of pairs counts its pairs per output chunk, checking every index on the way.
    const int64_t num_ranges = std::max<int64_t>(1, std::min<int64_t>(NumCpuThreads(context), n / 4096));
    auto range_begin = [&](int64_t r) { return r * n / num_ranges; };
    Tensor counts_tensor;
    TF_RETURN_IF_ERROR(context->allocate_temp(::tensorflow::DT_INT64, {num_ranges, num_chunks + 1}, &counts_tensor));
    int64_t* counts = counts_tensor.flat<int64_t>().data();  // row r: counts of range r, then its first bad pair
    std::fill(counts, counts + counts_tensor.NumElements(), 0);
    ParallelForBlocks(context, num_ranges, 1, n / num_ranges + 1, [&](int64_t first, int64_t last) {
      for (int64_t r = first; r < last; ++r) {
        int64_t* row = counts + r * (num_chunks + 1);
        row[num_chunks] = CountPairsPerChunk(pair_indices, range_begin(r), range_begin(r + 1), size, row);
      }
    });
    *bad_position = -1;
    for (int64_t r = 0; r < num_ranges; ++r) {
      const int64_t bad = counts[r * (num_chunks + 1) + num_chunks];
      if (bad >= 0) {
        *bad_position = bad;
        *bad_index = pair_indices[bad];
        return ::tensorflow::OkStatus();
      }
    }

    // 2. Exclusive prefix sum in (chunk, range) order turns counts into cursors, so that the sort is
    //    stable: within a chunk, pairs keep their order. chunk_start[c] is where chunk c begins.
    std::vector<int64_t> chunk_start;
    TF_RETURN_IF_ERROR(HostScratch("the chunks' starts", [&] { chunk_start.resize(num_chunks + 1); }));
    int64_t total = 0;
    for (int64_t c = 0; c < num_chunks; ++c) {
      chunk_start[c] = total;
      for (int64_t r = 0; r < num_ranges; ++r) {
        int64_t& cell = counts[r * (num_chunks + 1) + c];
        const int64_t count = cell;
        cell = total;
        total += count;
      }
    }
    chunk_start[num_chunks] = total;

    Tensor sorted_values_tensor, sorted_indices_tensor;
    TF_RETURN_IF_ERROR(context->allocate_temp(values.dtype(), {total}, &sorted_values_tensor));
    TF_RETURN_IF_ERROR(context->allocate_temp(::tensorflow::DT_INT32, {total}, &sorted_indices_tensor));
    T* sorted_values = sorted_values_tensor.flat<T>().data();
    int32_t* sorted_indices = sorted_indices_tensor.flat<int32_t>().data();
    ParallelForBlocks(context, num_ranges, 1, n / num_ranges + 1, [&](int64_t first, int64_t last) {
      for (int64_t r = first; r < last; ++r) {
        SortPairsIntoChunks(pair_values, pair_indices, range_begin(r), range_begin(r + 1),
                            counts + r * (num_chunks + 1), sorted_values, sorted_indices);
      }
    });

    // 3. Each chunk of the output is zeroed and filled while it is in cache.
    T* out = dense->flat<T>().data();
    ParallelForBlocks(context, num_chunks, 1, int64_t{1} << kDecodeChunkLog2, [&](int64_t first, int64_t last) {
      for (int64_t c = first; c < last; ++c) {
        FillChunk(sorted_values, sorted_indices, chunk_start[c], chunk_start[c + 1], c, size, out);
      }
    });
    return ::tensorflow::OkStatus();
  }
};

namespace {

// values [n] T, indices [n] int32 -> dense [size] T.
template <typename Device, typename T>
class SparseBatchedDecodeOp : public ::tensorflow::OpKernel {
 public:
  explicit SparseBatchedDecodeOp(::tensorflow::OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("size", &size_));
    OP_REQUIRES_OK(context, CheckLengthAttr("size", size_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& values = context->input(0);
    const Tensor& indices = context->input(1);
    OP_REQUIRES_OK(context, CheckDecodePairs(values, indices));
    Tensor* dense = nullptr;
    OP_REQUIRES_OK(context, NameLengthAttr(context->allocate_output(0, {size_}, &dense), "size", size_));
    int64_t bad_position = -1;
    int32_t bad_index = 0;
    OP_REQUIRES_OK(context,
                   SparseBatchedDecodeLauncher<Device, T>()(context, values, indices, dense, &bad_position, &bad_index));
    // An index out of range fails the op, so the output (undefined then) is never seen.
    OP_REQUIRES(context, bad_position < 0, BadDecodeIndex(bad_position, bad_index, size_));
  }

 private:
  int64_t size_;
};

TFCOMP_REGISTER_KERNELS("Tfcomp>SparseBatchedDecode", SparseBatchedDecodeOp, );

}  // namespace
}  // namespace tfcomp
