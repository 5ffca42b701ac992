// CUDA sum_pairs, bit for bit the CPU kernel (ops/cc/lib/sum_pairs.h) as TensorFlow runs it.
// SumPairsPerIndex splits the rows into indices and values (finding the first negative index in the
// same pass), sorts them stably by index with CUB (so each index's values stay in row order),
// numbers the runs of equal indices, and lets the thread at each run's head add 0 and then the
// run's values in order, one float32 rounding per addition, denormals flushed as on TensorFlow's CPU
// threads (SumPairsAdd). SumPairsKeep sorts the sums' SelectionKeys to find the max_pairs-th
// smallest and compacts the sums up to it, in index order. See tfcomp_cuda.h.
#include <cub/cub.cuh>

#include "ops/cc/cuda/device_util.cuh"
#include "ops/cc/cuda/tfcomp_cuda.h"
#include "ops/cc/lib/sum_pairs.h"

namespace tfcomp {
namespace cuda {
namespace {

// Bits of the sort keys that vary: an index >= 0 has 31; a SelectionKey is below 2^63 (its high
// word is 0x7FFFFFFF minus a magnitude, its low word an index).
constexpr int kIndexBits = 31;
constexpr int kSelectionKeyBits = 63;

// indices[r], values[r] = rows[2 r], rows[2 r + 1] (as unsigned sort keys and bits), and
// *first_negative = min(*first_negative, the first r with rows[2 r] < 0): each thread's first in its
// grid-stride walk, then the warp's smallest, one atomic per warp that found one.
__global__ void SplitRows(const int32_t* rows, int64_t n, uint32_t* indices, uint32_t* values,
                          unsigned long long* first_negative) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  long long first = n;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < n; r += stride) {
    const int32_t index = rows[2 * r];
    indices[r] = static_cast<uint32_t>(index);
    values[r] = static_cast<uint32_t>(rows[2 * r + 1]);
    if (index < 0 && first == n) first = r;
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    const long long other = __shfl_down_sync(0xFFFFFFFFu, first, offset);
    first = other < first ? other : first;
  }
  if (threadIdx.x % 32 == 0 && first < n) atomicMin(first_negative, static_cast<unsigned long long>(first));
}

// heads[i] = 1 where sorted position i starts a run of equal indices, else 0.
__global__ void MarkRunHeads(const uint32_t* indices, int64_t n, int32_t* heads) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    heads[i] = i == 0 || indices[i] != indices[i - 1] ? 1 : 0;
  }
}

// The thread at the head of each run (runs[i]: the run's number plus 1, the inclusive sum of the
// heads) adds 0 and then the run's values in sorted order, which is row order (the sort is stable),
// and writes the run's (index, sum bits) as row runs[i] - 1 of sums; *distinct = the number of runs.
__global__ void SumRuns(const uint32_t* indices, const uint32_t* values, const int32_t* runs, int64_t n,
                        int32_t* sums, int64_t* distinct) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    if (i == n - 1) *distinct = runs[i];
    const uint32_t index = indices[i];
    if (i > 0 && indices[i - 1] == index) continue;
    uint32_t sum = 0;
    for (int64_t j = i; j < n && indices[j] == index; ++j) sum = SumPairsAdd(sum, values[j]);
    const int64_t row = runs[i] - 1;
    sums[2 * row] = static_cast<int32_t>(index);
    sums[2 * row + 1] = static_cast<int32_t>(sum);
  }
}

// keys[j] = SelectionKey of sums row j.
__global__ void MakeSelectionKeys(const int32_t* sums, int64_t m, unsigned long long* keys) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < m; j += stride) {
    keys[j] = SelectionKey(sums[2 * j], static_cast<uint32_t>(sums[2 * j + 1]));
  }
}

// kept[j] = 1 where row j's SelectionKey is at most *limit (the max_pairs-th smallest), else 0.
__global__ void FlagKept(const int32_t* sums, int64_t m, const unsigned long long* limit, int32_t* kept) {
  const unsigned long long last = *limit;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < m; j += stride) {
    kept[j] = SelectionKey(sums[2 * j], static_cast<uint32_t>(sums[2 * j + 1])) <= last ? 1 : 0;
  }
}

// The flagged rows of sums, each to its position (the exclusive sum of the flags) in out.
__global__ void CompactKept(const int32_t* sums, int64_t m, const int32_t* flags, const int32_t* positions,
                            int32_t* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < m; j += stride) {
    if (flags[j] == 0) continue;
    const int64_t row = positions[j];
    out[2 * row] = sums[2 * j];
    out[2 * row + 1] = sums[2 * j + 1];
  }
}

}  // namespace

cudaError_t SumPairsPerIndex(const int32_t* rows, int64_t n, int32_t* sums, int64_t* first_negative,
                             int64_t* distinct, void* scratch, size_t* scratch_bytes, cudaStream_t stream) {
  if (n < 0 || n > kMaxElements || first_negative == nullptr || distinct == nullptr ||
      (n > 0 && (rows == nullptr || sums == nullptr))) {
    return cudaErrorInvalidValue;
  }
  const int items = static_cast<int>(n);
  ScratchCarver carver(scratch);
  // After the sort, the alternate buffers are free: the run heads and their sums go there.
  cub::DoubleBuffer<uint32_t> indices(carver.Take<uint32_t>(n), carver.Take<uint32_t>(n));
  cub::DoubleBuffer<uint32_t> values(carver.Take<uint32_t>(n), carver.Take<uint32_t>(n));
  size_t sort_bytes = 0, scan_bytes = 0;
  if (n > 0) {
    TFCOMP_CUDA_RETURN_IF_ERROR(
        cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, indices, values, items, 0, kIndexBits, stream));
    TFCOMP_CUDA_RETURN_IF_ERROR(cub::DeviceScan::InclusiveSum(nullptr, scan_bytes, static_cast<const int32_t*>(nullptr),
                                                              static_cast<int32_t*>(nullptr), items, stream));
  }
  const size_t cub_bytes = sort_bytes > scan_bytes ? sort_bytes : scan_bytes;
  void* cub_scratch = carver.TakeBytes(cub_bytes);
  TFCOMP_CUDA_ANSWER_SCRATCH_QUERY(carver, scratch, scratch_bytes);

  // 0x7F in every byte: a row far above any n.
  TFCOMP_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(first_negative, 0x7F, sizeof(*first_negative), stream));
  if (n == 0) return cudaMemsetAsync(distinct, 0, sizeof(*distinct), stream);
  const unsigned int blocks = NumBlocks(n, kThreads * 4);
  SplitRows<<<blocks, kThreads, 0, stream>>>(rows, n, indices.Current(), values.Current(),
                                             reinterpret_cast<unsigned long long*>(first_negative));
  TFCOMP_CUDA_RETURN_IF_LAUNCH_FAILED();
  size_t bytes = cub_bytes;
  TFCOMP_CUDA_RETURN_IF_ERROR(
      cub::DeviceRadixSort::SortPairs(cub_scratch, bytes, indices, values, items, 0, kIndexBits, stream));
  int32_t* heads = reinterpret_cast<int32_t*>(indices.Alternate());
  int32_t* runs = reinterpret_cast<int32_t*>(values.Alternate());
  MarkRunHeads<<<blocks, kThreads, 0, stream>>>(indices.Current(), n, heads);
  TFCOMP_CUDA_RETURN_IF_LAUNCH_FAILED();
  bytes = cub_bytes;
  TFCOMP_CUDA_RETURN_IF_ERROR(
      cub::DeviceScan::InclusiveSum(cub_scratch, bytes, static_cast<const int32_t*>(heads), runs, items, stream));
  SumRuns<<<NumBlocks(n, kThreads), kThreads, 0, stream>>>(indices.Current(), values.Current(), runs, n, sums,
                                                           distinct);
  TFCOMP_CUDA_RETURN_IF_LAUNCH_FAILED();
  return cudaSuccess;
}

cudaError_t SumPairsKeep(const int32_t* sums, int64_t m, int64_t max_pairs, int32_t* kept, void* scratch,
                         size_t* scratch_bytes, cudaStream_t stream) {
  if (m < 0 || m > kMaxElements || max_pairs < -1) return cudaErrorInvalidValue;
  const bool all = max_pairs == -1 || max_pairs >= m;
  const int64_t count = all ? m : max_pairs;
  if (count > 0 && (sums == nullptr || kept == nullptr)) return cudaErrorInvalidValue;
  const bool select = !all && count > 0;
  const int items = static_cast<int>(m);
  ScratchCarver carver(scratch);
  cub::DoubleBuffer<unsigned long long> keys(nullptr, nullptr);
  int32_t* flags = nullptr;
  int32_t* positions = nullptr;
  size_t sort_bytes = 0, scan_bytes = 0;
  if (select) {
    keys = cub::DoubleBuffer<unsigned long long>(carver.Take<unsigned long long>(m),
                                                 carver.Take<unsigned long long>(m));
    flags = carver.Take<int32_t>(m);
    positions = carver.Take<int32_t>(m);
    TFCOMP_CUDA_RETURN_IF_ERROR(
        cub::DeviceRadixSort::SortKeys(nullptr, sort_bytes, keys, items, 0, kSelectionKeyBits, stream));
    TFCOMP_CUDA_RETURN_IF_ERROR(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, flags, positions, items, stream));
  }
  const size_t cub_bytes = sort_bytes > scan_bytes ? sort_bytes : scan_bytes;
  void* cub_scratch = carver.TakeBytes(cub_bytes);
  TFCOMP_CUDA_ANSWER_SCRATCH_QUERY(carver, scratch, scratch_bytes);

  if (count == 0) return cudaSuccess;
  if (all) return cudaMemcpyAsync(kept, sums, 2 * m * sizeof(int32_t), cudaMemcpyDeviceToDevice, stream);
  const unsigned int blocks = NumBlocks(m, kThreads * 4);
  MakeSelectionKeys<<<blocks, kThreads, 0, stream>>>(sums, m, keys.Current());
  TFCOMP_CUDA_RETURN_IF_LAUNCH_FAILED();
  size_t bytes = cub_bytes;
  TFCOMP_CUDA_RETURN_IF_ERROR(
      cub::DeviceRadixSort::SortKeys(cub_scratch, bytes, keys, items, 0, kSelectionKeyBits, stream));
  FlagKept<<<blocks, kThreads, 0, stream>>>(sums, m, keys.Current() + (max_pairs - 1), flags);
  TFCOMP_CUDA_RETURN_IF_LAUNCH_FAILED();
  bytes = cub_bytes;
  TFCOMP_CUDA_RETURN_IF_ERROR(cub::DeviceScan::ExclusiveSum(cub_scratch, bytes, flags, positions, items, stream));
  CompactKept<<<blocks, kThreads, 0, stream>>>(sums, m, flags, positions, kept);
  TFCOMP_CUDA_RETURN_IF_LAUNCH_FAILED();
  return cudaSuccess;
}

}  // namespace cuda
}  // namespace tfcomp
