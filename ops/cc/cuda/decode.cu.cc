// CUDA sparse_batched_decode (004 Sec. 4.3): zero the output, then one launch over all n pairs (the K
// payloads concatenated) adds each value at its index with atomicAdd. The order of the additions
// into one element is unspecified (the only difference from the CPU kernel). See tfcomp_cuda.h.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "ops/cc/cuda/device_util.cuh"
#include "ops/cc/cuda/tfcomp_cuda.h"
#include "ops/cc/lib/magnitude.h"

namespace tfcomp {
namespace cuda {
namespace {

// The CUDA arithmetic type of a format, and its value from raw bits.
template <class Format>
struct Arithmetic;
template <>
struct Arithmetic<Float32Format> {
  using type = float;
  __device__ static float FromBits(uint32_t bits) { return __uint_as_float(bits); }
};
template <>
struct Arithmetic<Float16Format> {
  using type = __half;
  __device__ static __half FromBits(uint16_t bits) { return __ushort_as_half(bits); }
};
template <>
struct Arithmetic<BFloat16Format> {
  using type = __nv_bfloat16;
  __device__ static __nv_bfloat16 FromBits(uint16_t bits) { return __ushort_as_bfloat16(bits); }
};

// dense: [size], zeroed before the launch; *first_bad: set high before the launch.
template <class Format>
__global__ void ScatterAdd(const typename Format::Bits* values, const int32_t* indices, int64_t n, int64_t size,
                           typename Arithmetic<Format>::type* dense, unsigned long long* first_bad) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < n; p += stride) {
    const int64_t index = indices[p];
    if (index >= 0 && index < size) {
      atomicAdd(dense + index, Arithmetic<Format>::FromBits(values[p]));
    } else if (index != -1) {
      atomicMin(first_bad, static_cast<unsigned long long>(p));
    }
  }
}

}  // namespace

template <class Format>
cudaError_t SparseBatchedDecode(const typename Format::Bits* values, const int32_t* indices, int64_t n, int64_t size,
                                typename Format::Bits* dense, int64_t* first_bad, cudaStream_t stream) {
  if (n < 0 || size < 0) return cudaErrorInvalidValue;
  // 0x7F in every byte: a position far above any n.
  TFCOMP_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(first_bad, 0x7F, sizeof(*first_bad), stream));
  if (size > 0) TFCOMP_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dense, 0, size * sizeof(*dense), stream));
  if (n == 0) return cudaSuccess;
  ScatterAdd<Format><<<NumBlocks(n, kThreads * 4), kThreads, 0, stream>>>(
      values, indices, n, size, reinterpret_cast<typename Arithmetic<Format>::type*>(dense),
      reinterpret_cast<unsigned long long*>(first_bad));
  TFCOMP_CUDA_RETURN_IF_LAUNCH_FAILED();
  return cudaSuccess;
}

#define TFCOMP_INSTANTIATE(Format)                                                                        \
  template cudaError_t SparseBatchedDecode<Format>(const Format::Bits*, const int32_t*, int64_t, int64_t, \
                                                   Format::Bits*, int64_t*, cudaStream_t);
TFCOMP_FOR_EACH_FORMAT(TFCOMP_INSTANTIATE)
#undef TFCOMP_INSTANTIATE

}  // namespace cuda
}  // namespace tfcomp
