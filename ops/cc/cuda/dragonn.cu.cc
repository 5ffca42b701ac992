// CUDA dragonn_compress (004 Algorithm 1): one pass over grad in which every selected element does
// an atomicMax of its 64-bit SlotWord into its slot (deterministic: the largest word wins whatever
// the thread order, as on the CPU), then the slots are unpacked. See tfcomp_cuda.h.
#include "ops/cc/cuda/device_util.cuh"
#include "ops/cc/cuda/tfcomp_cuda.h"
#include "ops/cc/lib/hashing.h"
#include "ops/cc/lib/magnitude.h"
#include "ops/cc/lib/words.h"

namespace tfcomp {
namespace cuda {
namespace {

// slots: [num_slots], zeroed before the launch.
template <class Format>
__global__ void HashIntoSlots(const typename Format::Bits* grad, int64_t size, const float* threshold,
                              const int64_t* seed, uint32_t num_slots, unsigned long long* slots) {
  using Bits = typename Format::Bits;
  const Bits threshold_key = ThresholdKey<Format>(*threshold);
  const SlotHash hash = SlotHash::FromSeed(static_cast<uint64_t>(*seed), num_slots);
  ForEachElement(grad, size, [&](int64_t i, Bits bits) {
    if (IsSelected<Format>(bits, threshold_key)) {
      atomicMax(slots + hash(static_cast<uint32_t>(i)), static_cast<unsigned long long>(SlotWord<Format>(bits, i)));
    }
  });
}

template <class Format>
__global__ void UnpackSlots(const unsigned long long* slots, int64_t num_slots, typename Format::Bits* values,
                            int32_t* indices) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t s = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; s < num_slots; s += stride) {
    const unsigned long long word = slots[s];
    indices[s] = SlotIndex(word);
    values[s] = SlotValueBits<Format>(word);
  }
}

}  // namespace

template <class Format>
cudaError_t DragonnCompress(const typename Format::Bits* grad, int64_t size, const float* threshold,
                            const int64_t* seed, int64_t num_slots, typename Format::Bits* values, int32_t* indices,
                            void* scratch, size_t* scratch_bytes, cudaStream_t stream) {
  if (size < 0 || size > kMaxElements || num_slots < 1 || num_slots > kMaxElements) return cudaErrorInvalidValue;
  ScratchCarver carver(scratch);
  unsigned long long* slots = carver.Take<unsigned long long>(num_slots);
  TFCOMP_CUDA_ANSWER_SCRATCH_QUERY(carver, scratch, scratch_bytes);

  TFCOMP_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(slots, 0, num_slots * sizeof(*slots), stream));
  HashIntoSlots<Format><<<PassBlocks<typename Format::Bits>(size), kThreads, 0, stream>>>(
      grad, size, threshold, seed, static_cast<uint32_t>(num_slots), slots);
  TFCOMP_CUDA_RETURN_IF_LAUNCH_FAILED();
  UnpackSlots<Format><<<NumBlocks(num_slots, kThreads * 4), kThreads, 0, stream>>>(slots, num_slots, values, indices);
  TFCOMP_CUDA_RETURN_IF_LAUNCH_FAILED();
  return cudaSuccess;
}

#define TFCOMP_INSTANTIATE(Format)                                                                                  \
  template cudaError_t DragonnCompress<Format>(const Format::Bits*, int64_t, const float*, const int64_t*, int64_t, \
                                               Format::Bits*, int32_t*, void*, size_t*, cudaStream_t);
TFCOMP_FOR_EACH_FORMAT(TFCOMP_INSTANTIATE)
#undef TFCOMP_INSTANTIATE

}  // namespace cuda
}  // namespace tfcomp
