// CUDA sparse_batched_decode (004 Sec. 4.3), deterministic and, NaN payloads aside, bit-identical to
// the CPU kernel, which sorts the pairs by output chunk, then fills each chunk in cache. Here the n
// pairs (K payloads concatenated) are sorted stably by output tile of kTile elements (a CUB radix
// sort on the tile bits of the index alone: two passes up to 2^28 elements); each block then adds its
// tile's pairs in pair order, in the format's arithmetic, into shared memory and writes the whole
// tile, zeros included, once. The output is written once, with no global atomics, whatever K is.
// See tfcomp_cuda.h.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cub/cub.cuh>

#include "ops/cc/cuda/device_util.cuh"
#include "ops/cc/cuda/tfcomp_cuda.h"
#include "ops/cc/lib/magnitude.h"

namespace tfcomp {
namespace cuda {
namespace {

constexpr int kTileLog2 = 12;
constexpr int64_t kTile = int64_t{1} << kTileLog2;  // output elements per block: 16 KiB of float32

// A format's value as float32, and a float32 rounded to the format (round to nearest even). Adding
// two values of the format in float32 and rounding once is the correctly rounded sum, as on the CPU.
template <class Format>
struct Arithmetic;
template <>
struct Arithmetic<Float32Format> {
  __device__ static float ToFloat(uint32_t bits) { return __uint_as_float(bits); }
  __device__ static uint32_t FromFloat(float value) { return __float_as_uint(value); }
};
template <>
struct Arithmetic<Float16Format> {
  __device__ static float ToFloat(uint16_t bits) { return __half2float(__ushort_as_half(bits)); }
  __device__ static uint16_t FromFloat(float value) { return __half_as_ushort(__float2half_rn(value)); }
};
template <>
struct Arithmetic<BFloat16Format> {
  __device__ static float ToFloat(uint16_t bits) { return __bfloat162float(__ushort_as_bfloat16(bits)); }
  __device__ static uint16_t FromFloat(float value) { return __bfloat16_as_ushort(__float2bfloat16_rn(value)); }
};

// keys[p] = indices[p] where it is in [0, size), else num_tiles * kTile (after every tile); and
// *first_bad = the smallest p with indices[p] < -1 or >= size (set high before the launch).
__global__ void PrepareKeys(const int32_t* indices, int64_t n, int64_t size, uint32_t past_last_tile,
                            uint32_t* keys, unsigned long long* first_bad) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < n; p += stride) {
    const int64_t index = indices[p];
    const bool valid = index >= 0 && index < size;
    keys[p] = valid ? static_cast<uint32_t>(index) : past_last_tile;
    if (!valid && index != -1) atomicMin(first_bad, static_cast<unsigned long long>(p));
  }
}

// tile_first[t] = the first position of keys[0, n) holding a key >= t * kTile, for t in
// [0, num_tiles]; keys are sorted by tile (key / kTile), so tile t's pairs are
// [tile_first[t], tile_first[t + 1]), in pair order.
__global__ void FindTileStarts(const uint32_t* keys, int64_t n, int64_t num_tiles, int64_t* tile_first) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t <= num_tiles; t += stride) {
    const uint32_t target = static_cast<uint32_t>(t * kTile);
    int64_t lo = 0, hi = n;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (keys[mid] < target) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    tile_first[t] = lo;
  }
}

// Block t writes dense[t * kTile, ...): its pairs are added into a shared-memory tile of zeros in
// pair order (as the CPU's dense[i] = 0; dense[i] += value), then the tile is stored with 16-byte
// writes. The block stages kThreads pairs at a time; one warp adds them, 32 at a time: lanes holding
// one index find each other (__match_any_sync) and the first of them adds the group in lane order.
template <class Format>
__global__ void __launch_bounds__(kThreads)
    FillTiles(const uint32_t* keys, const typename Format::Bits* values, const int64_t* tile_first, int64_t size,
              typename Format::Bits* dense) {
  using Bits = typename Format::Bits;
  using Math = Arithmetic<Format>;
  constexpr int kVector = 16 / sizeof(Bits);
  __shared__ uint4 tile_storage[kTile / kVector];
  __shared__ uint32_t staged_keys[kThreads];
  __shared__ Bits staged_values[kThreads];
  Bits* tile = reinterpret_cast<Bits*>(tile_storage);
  for (int v = threadIdx.x; v < kTile / kVector; v += kThreads) tile_storage[v] = make_uint4(0, 0, 0, 0);

  const int64_t lo = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t first = tile_first[blockIdx.x], last = tile_first[blockIdx.x + 1];
  for (int64_t base = first; base < last; base += kThreads) {
    const int64_t staged = last - base < kThreads ? last - base : kThreads;
    __syncthreads();  // the tile is zeroed, or the previous round is added
    if (threadIdx.x < staged) {
      staged_keys[threadIdx.x] = keys[base + threadIdx.x];
      staged_values[threadIdx.x] = values[base + threadIdx.x];
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      const int lane = threadIdx.x;
      for (int chunk = 0; chunk < staged; chunk += 32) {
        const bool active = chunk + lane < staged;
        // An inactive lane's key (all ones) matches no index of a tile.
        const uint32_t key = active ? staged_keys[chunk + lane] : 0xFFFFFFFFu;
        const unsigned int peers = __match_any_sync(0xFFFFFFFFu, key);
        if (active && lane == __ffs(peers) - 1) {
          Bits sum = tile[key - lo];
          for (unsigned int rest = peers; rest != 0; rest &= rest - 1) {
            sum = Math::FromFloat(Math::ToFloat(sum) + Math::ToFloat(staged_values[chunk + __ffs(rest) - 1]));
          }
          tile[key - lo] = sum;
        }
        __syncwarp();
      }
    }
  }
  __syncthreads();

  const int64_t length = size - lo < kTile ? size - lo : kTile;
  Bits* out = dense + lo;
  if (length == kTile && reinterpret_cast<uintptr_t>(out) % 16 == 0) {
    for (int v = threadIdx.x; v < kTile / kVector; v += kThreads) reinterpret_cast<uint4*>(out)[v] = tile_storage[v];
  } else {
    for (int64_t i = threadIdx.x; i < length; i += kThreads) out[i] = tile[i];
  }
}

}  // namespace

template <class Format>
cudaError_t SparseBatchedDecode(const typename Format::Bits* values, const int32_t* indices, int64_t n, int64_t size,
                                typename Format::Bits* dense, int64_t* first_bad, void* scratch, size_t* scratch_bytes,
                                cudaStream_t stream) {
  using Bits = typename Format::Bits;
  if (n < 0 || n > kMaxElements || size < 0 || size > kMaxElements) return cudaErrorInvalidValue;
  const int64_t num_tiles = (size + kTile - 1) / kTile;
  const uint32_t past_last_tile = static_cast<uint32_t>(num_tiles * kTile);
  // The sort orders by tile alone: bits [kTileLog2, end_bit) of the keys, up to past_last_tile's.
  int end_bit = kTileLog2 + 1;
  while ((int64_t{1} << end_bit) <= past_last_tile) ++end_bit;
  ScratchCarver carver(scratch);
  uint32_t* keys = carver.Take<uint32_t>(n);
  uint32_t* sorted_keys = carver.Take<uint32_t>(n);
  Bits* sorted_values = carver.Take<Bits>(n);
  int64_t* tile_first = carver.Take<int64_t>(num_tiles + 1);
  size_t sort_bytes = 0;
  if (n > 0) {
    TFCOMP_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys, sorted_keys, values,
                                                                sorted_values, static_cast<int>(n), kTileLog2, end_bit,
                                                                stream));
  }
  void* sort_scratch = carver.TakeBytes(sort_bytes);
  TFCOMP_CUDA_ANSWER_SCRATCH_QUERY(carver, scratch, scratch_bytes);

  // 0x7F in every byte: a position far above any n.
  TFCOMP_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(first_bad, 0x7F, sizeof(*first_bad), stream));
  if (n == 0 || size == 0) {
    if (n > 0) {
      PrepareKeys<<<NumBlocks(n, kThreads * 4), kThreads, 0, stream>>>(
          indices, n, size, past_last_tile, keys, reinterpret_cast<unsigned long long*>(first_bad));
      TFCOMP_CUDA_RETURN_IF_LAUNCH_FAILED();
    }
    if (size > 0) TFCOMP_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dense, 0, size * sizeof(Bits), stream));
    return cudaSuccess;
  }
  PrepareKeys<<<NumBlocks(n, kThreads * 4), kThreads, 0, stream>>>(
      indices, n, size, past_last_tile, keys, reinterpret_cast<unsigned long long*>(first_bad));
  TFCOMP_CUDA_RETURN_IF_LAUNCH_FAILED();
  TFCOMP_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairs(sort_scratch, sort_bytes, keys, sorted_keys, values,
                                                              sorted_values, static_cast<int>(n), kTileLog2, end_bit,
                                                              stream));
  FindTileStarts<<<NumBlocks(num_tiles + 1, kThreads), kThreads, 0, stream>>>(sorted_keys, n, num_tiles, tile_first);
  TFCOMP_CUDA_RETURN_IF_LAUNCH_FAILED();
  FillTiles<Format><<<static_cast<unsigned int>(num_tiles), kThreads, 0, stream>>>(sorted_keys, sorted_values,
                                                                                   tile_first, size, dense);
  TFCOMP_CUDA_RETURN_IF_LAUNCH_FAILED();
  return cudaSuccess;
}

#define TFCOMP_INSTANTIATE(Format)                                                                        \
  template cudaError_t SparseBatchedDecode<Format>(const Format::Bits*, const int32_t*, int64_t, int64_t, \
                                                   Format::Bits*, int64_t*, void*, size_t*, cudaStream_t);
TFCOMP_FOR_EACH_FORMAT(TFCOMP_INSTANTIATE)
#undef TFCOMP_INSTANTIATE

}  // namespace cuda
}  // namespace tfcomp
