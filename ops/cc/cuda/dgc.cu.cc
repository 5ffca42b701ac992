// CUDA dgc_compress (004 Algorithm 3, the baseline), done the way DGC implementations do it on a GPU:
// mask, prefix sum, compaction. Pass 1 counts the selected elements of each tile of kTile elements;
// a CUB exclusive sum over the tile counts gives each tile its output offset; pass 2 re-reads each
// tile, scans the per-thread counts within the block (cub::BlockScan) and writes the selected
// elements in index order, up to max_out. See tfcomp_cuda.h.
#include <cub/cub.cuh>

#include "ops/cc/cuda/device_util.cuh"
#include "ops/cc/cuda/tfcomp_cuda.h"
#include "ops/cc/lib/magnitude.h"

namespace tfcomp {
namespace cuda {
namespace {

constexpr int kItemsPerThread = 16;  // contiguous elements per thread: a 16-bit selection mask
constexpr int64_t kTile = int64_t{kThreads} * kItemsPerThread;

// Bit j is set when grad[begin + j] is selected (and begin + j < size), for j in [0, kItemsPerThread).
template <class Format>
__device__ __forceinline__ uint32_t SelectionMask(const typename Format::Bits* grad, int64_t size, int64_t begin,
                                                  typename Format::Bits threshold_key) {
  using Bits = typename Format::Bits;
  constexpr int kVector = 16 / sizeof(Bits);
  uint32_t mask = 0;
  if (begin + kItemsPerThread <= size && reinterpret_cast<uintptr_t>(grad + begin) % 16 == 0) {
#pragma unroll
    for (int v = 0; v < kItemsPerThread / kVector; ++v) {
      union {
        uint4 raw;
        Bits bits[kVector];
      } chunk;
      chunk.raw = __ldg(reinterpret_cast<const uint4*>(grad + begin) + v);
#pragma unroll
      for (int j = 0; j < kVector; ++j) {
        mask |= static_cast<uint32_t>(IsSelected<Format>(chunk.bits[j], threshold_key)) << (v * kVector + j);
      }
    }
  } else {
    for (int j = 0; j < kItemsPerThread && begin + j < size; ++j) {
      mask |= static_cast<uint32_t>(IsSelected<Format>(grad[begin + j], threshold_key)) << j;
    }
  }
  return mask;
}

// Block b counts the selected elements of tile b into tile_counts[b].
template <class Format>
__global__ void __launch_bounds__(kThreads)
    CountTiles(const typename Format::Bits* grad, int64_t size, const float* threshold, int32_t* tile_counts) {
  using BlockReduce = cub::BlockReduce<int32_t, kThreads>;
  __shared__ typename BlockReduce::TempStorage reduce_storage;
  const int64_t begin = blockIdx.x * kTile + static_cast<int64_t>(threadIdx.x) * kItemsPerThread;
  const uint32_t mask = SelectionMask<Format>(grad, size, begin, ThresholdKey<Format>(*threshold));
  const int32_t tile_count = BlockReduce(reduce_storage).Sum(__popc(mask));
  if (threadIdx.x == 0) tile_counts[blockIdx.x] = tile_count;
}

// Block b writes the selected elements of tile b at tile_offsets[b] onwards, those before max_out.
template <class Format>
__global__ void __launch_bounds__(kThreads)
    CompactTiles(const typename Format::Bits* grad, int64_t size, const float* threshold, const int32_t* tile_offsets,
                 int64_t max_out, typename Format::Bits* values, int32_t* indices) {
  using BlockScan = cub::BlockScan<int32_t, kThreads>;
  __shared__ typename BlockScan::TempStorage scan_storage;
  const int64_t tile_offset = tile_offsets[blockIdx.x];
  if (tile_offset >= max_out) return;  // the same for the whole block
  const int64_t begin = blockIdx.x * kTile + static_cast<int64_t>(threadIdx.x) * kItemsPerThread;
  uint32_t mask = SelectionMask<Format>(grad, size, begin, ThresholdKey<Format>(*threshold));
  int32_t thread_offset;
  BlockScan(scan_storage).ExclusiveSum(__popc(mask), thread_offset);
  for (int64_t out = tile_offset + thread_offset; mask != 0 && out < max_out; mask &= mask - 1, ++out) {
    const int64_t i = begin + __ffs(mask) - 1;
    indices[out] = static_cast<int32_t>(i);
    values[out] = grad[i];
  }
}

}  // namespace

template <class Format>
cudaError_t DgcCompress(const typename Format::Bits* grad, int64_t size, const float* threshold, int64_t max_out,
                        typename Format::Bits* values, int32_t* indices, void* scratch, size_t* scratch_bytes,
                        cudaStream_t stream) {
  if (size < 0 || size > kMaxElements || max_out < 1 || max_out > kMaxElements) return cudaErrorInvalidValue;
  const int64_t num_tiles = (size + kTile - 1) / kTile;
  ScratchCarver carver(scratch);
  int32_t* tile_counts = carver.Take<int32_t>(num_tiles);
  int32_t* tile_offsets = carver.Take<int32_t>(num_tiles);
  size_t scan_bytes = 0;
  TFCOMP_CUDA_RETURN_IF_ERROR(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, tile_counts, tile_offsets,
                                                            static_cast<int>(num_tiles), stream));
  void* scan_scratch = carver.TakeBytes(scan_bytes);
  TFCOMP_CUDA_ANSWER_SCRATCH_QUERY(carver, scratch, scratch_bytes);

  // Padding first (index -1 is all one bits, value +0); the compaction overwrites the front.
  TFCOMP_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(indices, 0xFF, max_out * sizeof(int32_t), stream));
  TFCOMP_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(values, 0, max_out * sizeof(typename Format::Bits), stream));
  if (num_tiles == 0) return cudaSuccess;
  CountTiles<Format><<<static_cast<unsigned int>(num_tiles), kThreads, 0, stream>>>(grad, size, threshold, tile_counts);
  TFCOMP_CUDA_RETURN_IF_LAUNCH_FAILED();
  TFCOMP_CUDA_RETURN_IF_ERROR(cub::DeviceScan::ExclusiveSum(scan_scratch, scan_bytes, tile_counts, tile_offsets,
                                                            static_cast<int>(num_tiles), stream));
  CompactTiles<Format><<<static_cast<unsigned int>(num_tiles), kThreads, 0, stream>>>(
      grad, size, threshold, tile_offsets, max_out, values, indices);
  TFCOMP_CUDA_RETURN_IF_LAUNCH_FAILED();
  return cudaSuccess;
}

#define TFCOMP_INSTANTIATE(Format)                                                                             \
  template cudaError_t DgcCompress<Format>(const Format::Bits*, int64_t, const float*, int64_t, Format::Bits*, \
                                           int32_t*, void*, size_t*, cudaStream_t);
TFCOMP_FOR_EACH_FORMAT(TFCOMP_INSTANTIATE)
#undef TFCOMP_INSTANTIATE

}  // namespace cuda
}  // namespace tfcomp
