// CUDA estimate_threshold: gather the stratified sample's magnitude keys, sort them (CUB), pick the
// k-th largest finite key on the device. See tfcomp_cuda.h.
#include <cub/cub.cuh>

#include "ops/cc/cuda/device_util.cuh"
#include "ops/cc/cuda/tfcomp_cuda.h"
#include "ops/cc/lib/hashing.h"
#include "ops/cc/lib/magnitude.h"

namespace tfcomp {
namespace cuda {
namespace {

// keys[i] = magnitude key of grad[SamplePosition(i, n, size, *seed)] (grad[i] when n == size).
template <class Format>
__global__ void GatherSampleKeys(const typename Format::Bits* grad, int64_t size, int64_t n, const int64_t* seed,
                                 typename Format::Bits* keys) {
  const uint64_t sample_seed = static_cast<uint64_t>(*seed);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t position = n == size ? i : SamplePosition(i, n, size, sample_seed);
    keys[i] = MagnitudeKey<Format>(grad[position]);
  }
}

// One thread: the non-finite keys lead the descending order; *threshold = the value of the k-th
// finite key (the last one when fewer than k), or of Format::kMaxFiniteKey when none is finite.
template <class Format>
__global__ void SelectKthFiniteKey(const typename Format::Bits* sorted_descending, int64_t n, int64_t k,
                                   float* threshold) {
  int64_t lo = 0, hi = n;  // first position holding a finite key
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (sorted_descending[mid] >= Format::kInfKey) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  const int64_t num_finite = n - lo;
  const typename Format::Bits key =
      num_finite == 0 ? Format::kMaxFiniteKey : sorted_descending[lo + (k < num_finite ? k : num_finite) - 1];
  *threshold = Format::KeyToFloat(key);
}

}  // namespace

template <class Format>
cudaError_t EstimateThreshold(const typename Format::Bits* grad, int64_t size, int64_t n, int64_t k,
                              const int64_t* seed, float* threshold, void* scratch, size_t* scratch_bytes,
                              cudaStream_t stream) {
  using Bits = typename Format::Bits;
  if (size < 1 || n < 1 || n > size || n > kMaxElements || k < 1) return cudaErrorInvalidValue;
  ScratchCarver carver(scratch);
  Bits* keys = carver.Take<Bits>(n);
  Bits* sorted = carver.Take<Bits>(n);
  size_t sort_bytes = 0;
  TFCOMP_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortKeysDescending(
      nullptr, sort_bytes, keys, sorted, static_cast<int>(n), 0, 8 * sizeof(Bits), stream));
  void* sort_scratch = carver.TakeBytes(sort_bytes);
  TFCOMP_CUDA_ANSWER_SCRATCH_QUERY(carver, scratch, scratch_bytes);

  GatherSampleKeys<Format><<<NumBlocks(n, kThreads), kThreads, 0, stream>>>(grad, size, n, seed, keys);
  TFCOMP_CUDA_RETURN_IF_LAUNCH_FAILED();
  TFCOMP_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortKeysDescending(
      sort_scratch, sort_bytes, keys, sorted, static_cast<int>(n), 0, 8 * sizeof(Bits), stream));
  SelectKthFiniteKey<Format><<<1, 1, 0, stream>>>(sorted, n, k, threshold);
  TFCOMP_CUDA_RETURN_IF_LAUNCH_FAILED();
  return cudaSuccess;
}

#define TFCOMP_INSTANTIATE(Format)                                                                               \
  template cudaError_t EstimateThreshold<Format>(const Format::Bits*, int64_t, int64_t, int64_t, const int64_t*, \
                                                 float*, void*, size_t*, cudaStream_t);
TFCOMP_FOR_EACH_FORMAT(TFCOMP_INSTANTIATE)
#undef TFCOMP_INSTANTIATE

}  // namespace cuda
}  // namespace tfcomp
