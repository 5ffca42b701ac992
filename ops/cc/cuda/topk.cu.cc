// CUDA topk_compress: exact top-k. Every element becomes its 64-bit RankWord (magnitude key << 32 |
// index, so ties go to the larger index as on the CPU); a CUB radix sort orders the words, the first
// k are the winners, and a second, small radix sort puts their indices in increasing order.
// See tfcomp_cuda.h.
#include <cub/cub.cuh>

#include "ops/cc/cuda/device_util.cuh"
#include "ops/cc/cuda/tfcomp_cuda.h"
#include "ops/cc/lib/magnitude.h"
#include "ops/cc/lib/words.h"

namespace tfcomp {
namespace cuda {
namespace {

template <class Format>
__global__ void MakeRankWords(const typename Format::Bits* grad, int64_t size, unsigned long long* words) {
  ForEachElement(grad, size, [&](int64_t i, typename Format::Bits bits) { words[i] = RankWord<Format>(bits, i); });
}

// winners[j] = the index held by words[j], j < k.
__global__ void WinnerIndices(const unsigned long long* words, int64_t k, uint32_t* winners) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < k; j += stride) {
    winners[j] = static_cast<uint32_t>(words[j]);
  }
}

template <class Format>
__global__ void GatherWinners(const typename Format::Bits* grad, const uint32_t* winners, int64_t k,
                              typename Format::Bits* values, int32_t* indices) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < k; j += stride) {
    indices[j] = static_cast<int32_t>(winners[j]);
    values[j] = grad[winners[j]];
  }
}

}  // namespace

template <class Format>
cudaError_t TopkCompress(const typename Format::Bits* grad, int64_t size, int64_t k, typename Format::Bits* values,
                         int32_t* indices, void* scratch, size_t* scratch_bytes, cudaStream_t stream) {
  if (size < 1 || size > kMaxElements || k < 1 || k > size) return cudaErrorInvalidValue;
  // Bits of a rank word that vary: the index (bits 0-30) and the magnitude key (no sign bit).
  constexpr int kRankEndBit = 32 + 8 * sizeof(typename Format::Bits) - 1;
  ScratchCarver carver(scratch);
  cub::DoubleBuffer<unsigned long long> words(carver.Take<unsigned long long>(size),
                                              carver.Take<unsigned long long>(size));
  cub::DoubleBuffer<uint32_t> winners(carver.Take<uint32_t>(k), carver.Take<uint32_t>(k));
  size_t rank_sort_bytes = 0, index_sort_bytes = 0;
  TFCOMP_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortKeysDescending(nullptr, rank_sort_bytes, words,
                                                                       static_cast<int>(size), 0, kRankEndBit, stream));
  TFCOMP_CUDA_RETURN_IF_ERROR(
      cub::DeviceRadixSort::SortKeys(nullptr, index_sort_bytes, winners, static_cast<int>(k), 0, 31, stream));
  const size_t sort_bytes = rank_sort_bytes > index_sort_bytes ? rank_sort_bytes : index_sort_bytes;
  void* sort_scratch = carver.TakeBytes(sort_bytes);
  TFCOMP_CUDA_ANSWER_SCRATCH_QUERY(carver, scratch, scratch_bytes);

  MakeRankWords<Format><<<PassBlocks<typename Format::Bits>(size), kThreads, 0, stream>>>(grad, size, words.Current());
  TFCOMP_CUDA_RETURN_IF_LAUNCH_FAILED();
  size_t bytes = sort_bytes;
  TFCOMP_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortKeysDescending(sort_scratch, bytes, words,
                                                                       static_cast<int>(size), 0, kRankEndBit, stream));
  WinnerIndices<<<NumBlocks(k, kThreads * 4), kThreads, 0, stream>>>(words.Current(), k, winners.Current());
  TFCOMP_CUDA_RETURN_IF_LAUNCH_FAILED();
  bytes = sort_bytes;
  TFCOMP_CUDA_RETURN_IF_ERROR(
      cub::DeviceRadixSort::SortKeys(sort_scratch, bytes, winners, static_cast<int>(k), 0, 31, stream));
  GatherWinners<Format>
      <<<NumBlocks(k, kThreads * 4), kThreads, 0, stream>>>(grad, winners.Current(), k, values, indices);
  TFCOMP_CUDA_RETURN_IF_LAUNCH_FAILED();
  return cudaSuccess;
}

#define TFCOMP_INSTANTIATE(Format)                                                                                 \
  template cudaError_t TopkCompress<Format>(const Format::Bits*, int64_t, int64_t, Format::Bits*, int32_t*, void*, \
                                            size_t*, cudaStream_t);
TFCOMP_FOR_EACH_FORMAT(TFCOMP_INSTANTIATE)
#undef TFCOMP_INSTANTIATE

}  // namespace cuda
}  // namespace tfcomp
