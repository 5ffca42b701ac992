// CUDA momentum_accumulate and adam_accumulate: a grid-stride loop over the elements, each thread
// running the element-wise math of ops/cc/lib/accumulate.h. See tfcomp_cuda.h.
#include "ops/cc/cuda/device_util.cuh"
#include "ops/cc/cuda/tfcomp_cuda.h"

namespace tfcomp {
namespace cuda {
namespace {

__global__ void MomentumAccumulateKernel(const float* grad, const float* momentum, const float* residual,
                                         int64_t size, float mu, float* new_momentum, float* accumulated) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < size; i += stride) {
    MomentumAccumulateAt(i, grad, momentum, residual, mu, new_momentum, accumulated);
  }
}

__global__ void AdamAccumulateKernel(const float* grad, const float* m, const float* v, const float* residual,
                                     int64_t size, AdamCoefficients c, const float* m_correction,
                                     const float* v_correction, float* new_m, float* new_v, float* accumulated) {
  c.m_correction = *m_correction;
  c.v_correction = *v_correction;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < size; i += stride) {
    AdamAccumulateAt(i, grad, m, v, residual, c, new_m, new_v, accumulated);
  }
}

}  // namespace

cudaError_t MomentumAccumulate(const float* grad, const float* momentum, const float* residual, int64_t size, float mu,
                               float* new_momentum, float* accumulated, cudaStream_t stream) {
  if (size < 0 || size > kMaxElements) return cudaErrorInvalidValue;
  if (size == 0) return cudaSuccess;
  MomentumAccumulateKernel<<<NumBlocks(size, kThreads * 4), kThreads, 0, stream>>>(grad, momentum, residual, size, mu,
                                                                                   new_momentum, accumulated);
  TFCOMP_CUDA_RETURN_IF_LAUNCH_FAILED();
  return cudaSuccess;
}

cudaError_t AdamAccumulate(const float* grad, const float* m, const float* v, const float* residual, int64_t size,
                           AdamCoefficients constants, const float* m_correction, const float* v_correction,
                           float* new_m, float* new_v, float* accumulated, cudaStream_t stream) {
  if (size < 0 || size > kMaxElements) return cudaErrorInvalidValue;
  if (size == 0) return cudaSuccess;
  AdamAccumulateKernel<<<NumBlocks(size, kThreads * 4), kThreads, 0, stream>>>(
      grad, m, v, residual, size, constants, m_correction, v_correction, new_m, new_v, accumulated);
  TFCOMP_CUDA_RETURN_IF_LAUNCH_FAILED();
  return cudaSuccess;
}

}  // namespace cuda
}  // namespace tfcomp
