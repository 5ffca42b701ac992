// CUDA int_quantize and int_dequantize (IntQuant): one thread per int32 lane, each packing or
// unpacking its 32 / bits levels with the CPU's code (ops/cc/lib/quantize.h), a full lane's
// elements read in vector loads. See tfcomp_cuda.h.
#include "ops/cc/cuda/device_util.cuh"
#include "ops/cc/cuda/tfcomp_cuda.h"
#include "ops/cc/lib/hashing.h"
#include "ops/cc/lib/quantize.h"

namespace tfcomp {
namespace cuda {
namespace {

// The kFields floats of p (a lane's elements) in one or two vector loads; p aligned to their size.
template <int kFields>
__device__ __forceinline__ void LoadFields(const float* p, float* out) {
  if constexpr (kFields == 2) {
    const float2 v = __ldg(reinterpret_cast<const float2*>(p));
    out[0] = v.x;
    out[1] = v.y;
  } else {
#pragma unroll
    for (int q = 0; q < kFields / 4; ++q) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(p) + q);
      out[4 * q] = v.x;
      out[4 * q + 1] = v.y;
      out[4 * q + 2] = v.z;
      out[4 * q + 3] = v.w;
    }
  }
}

// One thread per lane; a full lane of an aligned gradient read in vector loads (PackedLane's
// arithmetic, so the lanes are the CPU's bit for bit).
template <int kBits>
__global__ void QuantizeLanes(const float* grad, int64_t size, const float* scale, const int64_t* seed, int32_t levels,
                              int32_t* lanes, int64_t num_lanes) {
  constexpr int kFields = 32 / kBits;
  const bool valid = IsValidScale(*scale);
  const float per_level = valid ? __fdiv_rn(static_cast<float>(levels), *scale) : 0.0f;
  const uint64_t key = Mix64(static_cast<uint64_t>(*seed));
  const bool aligned = reinterpret_cast<uintptr_t>(grad) % 16 == 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t lane = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; lane < num_lanes; lane += stride) {
    const int64_t first = lane * kFields;
    if (aligned && first + kFields <= size) {
      float values[kFields];
      LoadFields<kFields>(grad + first, values);
      lanes[lane] = PackLevels(values, kFields, first, per_level, valid, levels, kBits, key);
    } else {
      lanes[lane] = PackedLane(grad, size, per_level, valid, levels, kBits, key, lane);
    }
  }
}

__global__ void DequantizeLanes(const int32_t* lanes, int64_t size, const float* step, int bits, float* dense,
                                int64_t num_lanes) {
  const int fields = 32 / bits;
  const float step_value = *step;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t lane = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; lane < num_lanes; lane += stride) {
    const int64_t first = lane * fields;
    const int count = static_cast<int>(size - first < fields ? size - first : fields);
    UnpackLane(lanes[lane], bits, count, step_value, dense + first);
  }
}

bool ValidBits(int bits) { return bits == 4 || bits == 8 || bits == 16; }

}  // namespace

cudaError_t IntQuantize(const float* grad, int64_t size, const float* scale, const int64_t* seed, int bits,
                        int32_t levels, int32_t* lanes, cudaStream_t stream) {
  if (size < 0 || size > kMaxElements || !ValidBits(bits) || levels < 1 || levels > (1 << (bits - 1)) - 1) {
    return cudaErrorInvalidValue;
  }
  const int64_t num_lanes = (size + 32 / bits - 1) / (32 / bits);
  if (num_lanes == 0) return cudaSuccess;
  const unsigned int blocks = NumBlocks(num_lanes, kThreads);
  if (bits == 4) {
    QuantizeLanes<4><<<blocks, kThreads, 0, stream>>>(grad, size, scale, seed, levels, lanes, num_lanes);
  } else if (bits == 8) {
    QuantizeLanes<8><<<blocks, kThreads, 0, stream>>>(grad, size, scale, seed, levels, lanes, num_lanes);
  } else {
    QuantizeLanes<16><<<blocks, kThreads, 0, stream>>>(grad, size, scale, seed, levels, lanes, num_lanes);
  }
  TFCOMP_CUDA_RETURN_IF_LAUNCH_FAILED();
  return cudaSuccess;
}

cudaError_t IntDequantize(const int32_t* lanes, int64_t size, const float* step, int bits, float* dense,
                          cudaStream_t stream) {
  if (size < 0 || size > kMaxElements || !ValidBits(bits)) return cudaErrorInvalidValue;
  const int64_t num_lanes = (size + 32 / bits - 1) / (32 / bits);
  if (num_lanes == 0) return cudaSuccess;
  DequantizeLanes<<<NumBlocks(num_lanes, kThreads), kThreads, 0, stream>>>(lanes, size, step, bits, dense, num_lanes);
  TFCOMP_CUDA_RETURN_IF_LAUNCH_FAILED();
  return cudaSuccess;
}

}  // namespace cuda
}  // namespace tfcomp
