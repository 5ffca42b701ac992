// CUDA zero_at: one launch over the n indices clears the elements they name. See tfcomp_cuda.h.
#include "ops/cc/cuda/device_util.cuh"
#include "ops/cc/cuda/tfcomp_cuda.h"

namespace tfcomp {
namespace cuda {
namespace {

__global__ void ZeroAtKernel(float* data, int64_t size, const int32_t* indices, int64_t n, int64_t offset) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < n; p += stride) {
    const int64_t i = static_cast<int64_t>(indices[p]) - offset;
    if (i >= 0 && i < size) data[i] = 0.0f;
  }
}

}  // namespace

cudaError_t ZeroAt(float* data, int64_t size, const int32_t* indices, int64_t n, int64_t offset,
                   cudaStream_t stream) {
  if (n < 0 || size < 0 || offset < 0) return cudaErrorInvalidValue;
  if (n == 0 || size == 0) return cudaSuccess;
  ZeroAtKernel<<<NumBlocks(n, kThreads * 4), kThreads, 0, stream>>>(data, size, indices, n, offset);
  TFCOMP_CUDA_RETURN_IF_LAUNCH_FAILED();
  return cudaSuccess;
}

}  // namespace cuda
}  // namespace tfcomp
