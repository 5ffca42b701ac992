// Helpers shared by the CUDA sources (ops/cc/cuda/*.cu.cc and the harness): error propagation,
// scratch carving, launch sizes and a vectorised pass over a tensor. Device code only, no TensorFlow.
#ifndef TFCOMP_OPS_CC_CUDA_DEVICE_UTIL_CUH_
#define TFCOMP_OPS_CC_CUDA_DEVICE_UTIL_CUH_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ops/cc/lib/magnitude.h"

// Returns the error of a CUDA runtime or CUB call (cudaError_t) to the caller.
#define TFCOMP_CUDA_RETURN_IF_ERROR(expr)                   \
  do {                                                      \
    const cudaError_t tfcomp_error_ = (expr);               \
    if (tfcomp_error_ != cudaSuccess) return tfcomp_error_; \
  } while (0)

// After a kernel launch: returns the launch error, if any.
#define TFCOMP_CUDA_RETURN_IF_LAUNCH_FAILED() TFCOMP_CUDA_RETURN_IF_ERROR(cudaGetLastError())

// Expands M(Format) for the three gradient formats (explicit instantiations of the launchers).
#define TFCOMP_FOR_EACH_FORMAT(M) M(::tfcomp::Float32Format) M(::tfcomp::Float16Format) M(::tfcomp::BFloat16Format)

// In a launcher taking (void* scratch, size_t* scratch_bytes): after every buffer was taken from
// `carver`, answers a size query (scratch == nullptr) or rejects a scratch buffer that is too small.
#define TFCOMP_CUDA_ANSWER_SCRATCH_QUERY(carver, scratch, scratch_bytes)  \
  do {                                                                    \
    if ((scratch) == nullptr) {                                           \
      *(scratch_bytes) = (carver).used();                                 \
      return cudaSuccess;                                                 \
    }                                                                     \
    if (*(scratch_bytes) < (carver).used()) return cudaErrorInvalidValue; \
  } while (0)

namespace tfcomp {
namespace cuda {

constexpr int kThreads = 256;
// A grid never needs more blocks than this: the passes over a tensor are grid-stride loops, and
// 2^16 blocks of 256 threads saturate any current GPU.
constexpr int64_t kMaxBlocks = int64_t{1} << 16;
constexpr int64_t kMaxElements = (int64_t{1} << 31) - 1;

// Blocks for `work` items, `per_block` items per block, at least 1 and at most kMaxBlocks.
inline unsigned int NumBlocks(int64_t work, int64_t per_block) {
  const int64_t blocks = (work + per_block - 1) / per_block;
  return static_cast<unsigned int>(blocks < 1 ? 1 : blocks > kMaxBlocks ? kMaxBlocks : blocks);
}

// Carves aligned sub-buffers out of one scratch allocation. With a null base it only adds up sizes.
class ScratchCarver {
 public:
  explicit ScratchCarver(void* base) : base_(static_cast<char*>(base)) {}
  template <typename T>
  T* Take(int64_t count) {
    const size_t offset = used_;
    used_ += (static_cast<size_t>(count) * sizeof(T) + kAlign - 1) / kAlign * kAlign;
    return base_ == nullptr ? nullptr : reinterpret_cast<T*>(base_ + offset);
  }
  void* TakeBytes(size_t bytes) { return Take<char>(static_cast<int64_t>(bytes)); }
  size_t used() const { return used_; }

 private:
  static constexpr size_t kAlign = 256;
  char* base_;
  size_t used_ = 0;
};

// Calls visit(i, bits) for every element of g[0, size), spread over the whole grid, reading 16 bytes
// per load when g is 16-byte aligned. Coalesced; order unspecified. The loads stream (__ldcs, evict
// first): a pass reads each element once, and lines it leaves in L2 would push out what the pass
// keeps there (DRAGONN's slots: its hashing pass went from 1.07x the read floor to 1.00x on an H100).
template <class Bits, class Visit>
__device__ __forceinline__ void ForEachElement(const Bits* g, int64_t size, Visit&& visit) {
  constexpr int kVector = 16 / sizeof(Bits);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t num_vectors = reinterpret_cast<uintptr_t>(g) % 16 == 0 ? size / kVector : 0;
  for (int64_t v = first; v < num_vectors; v += stride) {
    union {
      uint4 raw;
      Bits bits[kVector];
    } chunk;
    chunk.raw = __ldcs(reinterpret_cast<const uint4*>(g) + v);
#pragma unroll
    for (int j = 0; j < kVector; ++j) visit(v * kVector + j, chunk.bits[j]);
  }
  for (int64_t i = num_vectors * kVector + first; i < size; i += stride) visit(i, g[i]);
}

// Programmatic dependent launch (sm_90 and newer): a kernel launched by LaunchDependent may start
// while the kernel before it in the stream is still running, so that its launch and its blocks'
// start overlap that kernel's last wave (about 1 to 2 us a launch on an H100). Such a kernel must call
// WaitForPreviousKernel() before it touches any memory: that waits for the previous kernel to
// finish and for its writes to be visible. A kernel that lets the next one start early calls
// AllowNextKernelToStart(); until all its blocks did (or exited), the next one waits at launch.
// Before sm_90 both are no-ops and LaunchDependent launches plainly.
__device__ __forceinline__ void WaitForPreviousKernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void AllowNextKernelToStart() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// kernel<<<blocks, kThreads, 0, stream>>>(args...), as a programmatic dependent launch where the
// current device supports it (see WaitForPreviousKernel).
template <class... Params, class... Args>
cudaError_t LaunchDependent(void (*kernel)(Params...), unsigned int blocks, cudaStream_t stream, Args... args) {
  int device = 0, major = 0;
  TFCOMP_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  TFCOMP_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = major >= 9 ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
}

// Blocks for a ForEachElement pass over `size` elements of `Bits`: about 4 vectors per thread.
template <class Bits>
inline unsigned int PassBlocks(int64_t size) {
  return NumBlocks(size, int64_t{kThreads} * 4 * (16 / sizeof(Bits)));
}

}  // namespace cuda
}  // namespace tfcomp

#endif  // TFCOMP_OPS_CC_CUDA_DEVICE_UTIL_CUH_
