// CUDA dragonn_compress (004 Algorithm 1): one pass over grad in which every selected element does
// an atomicMax of its 64-bit SlotWord into its slot (deterministic: the largest word wins whatever
// the thread order, as on the CPU), then the slots are unpacked, and zeroed for the next call on the
// same scratch; with an addend, the pass also adds it and writes the sum. See tfcomp_cuda.h.
#include "ops/cc/cuda/device_util.cuh"
#include "ops/cc/cuda/tfcomp_cuda.h"
#include "ops/cc/lib/hashing.h"
#include "ops/cc/lib/magnitude.h"
#include "ops/cc/lib/parts.h"
#include "ops/cc/lib/words.h"

namespace tfcomp {
namespace cuda {
namespace {

// The kernels of one call run as programmatic dependent launches (LaunchDependent): each waits for
// the one before, and the next may start launching once all its blocks started. Measured on an H100
// at 2^27, with the slots left zero by the call before: see research/notebook.md ("GPU kernels on an H100").

// slots[0, num_slots) = 0, for a scratch whose slots no call left zero.
__global__ void ZeroSlots(unsigned long long* slots, int64_t num_slots) {
  WaitForPreviousKernel();
  AllowNextKernelToStart();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t s = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; s < num_slots; s += stride) {
    slots[s] = 0;
  }
}

// slots: [num_slots], zeroed before the first part's launch; grad: one part of the gradient, its
// element i indexed i + index_offset.
template <class Format>
__global__ void HashIntoSlots(const typename Format::Bits* grad, int64_t size, int64_t index_offset,
                              const float* threshold, const int64_t* seed, uint32_t num_slots,
                              unsigned long long* slots) {
  using Bits = typename Format::Bits;
  WaitForPreviousKernel();
  AllowNextKernelToStart();
  const Bits threshold_key = ThresholdKey<Format>(*threshold);
  const SlotHash hash = SlotHash::FromSeed(static_cast<uint64_t>(*seed), num_slots);
  ForEachElement(grad, size, [&](int64_t i, Bits bits) {
    if (IsSelected<Format>(bits, threshold_key)) {
      const int64_t index = i + index_offset;
      atomicMax(slots + hash(static_cast<uint32_t>(index)),
                static_cast<unsigned long long>(SlotWord<Format>(bits, index)));
    }
  });
}

// HashIntoSlots over g = grad + addend (float32), which it writes to sum in the same pass.
__global__ void HashSumIntoSlots(const uint32_t* grad, const uint32_t* addend, uint32_t* sum, int64_t size,
                                 int64_t index_offset, const float* threshold, const int64_t* seed,
                                 uint32_t num_slots, unsigned long long* slots) {
  WaitForPreviousKernel();
  AllowNextKernelToStart();
  const uint32_t threshold_key = ThresholdKey<Float32Format>(*threshold);
  const SlotHash hash = SlotHash::FromSeed(static_cast<uint64_t>(*seed), num_slots);
  auto visit = [&](int64_t i, uint32_t bits) {
    if (IsSelected<Float32Format>(bits, threshold_key)) {
      const int64_t index = i + index_offset;
      atomicMax(slots + hash(static_cast<uint32_t>(index)),
                static_cast<unsigned long long>(SlotWord<Float32Format>(bits, index)));
    }
  };
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool aligned = (reinterpret_cast<uintptr_t>(grad) | reinterpret_cast<uintptr_t>(addend) |
                        reinterpret_cast<uintptr_t>(sum)) % 16 == 0;
  const int64_t num_vectors = aligned ? size / 4 : 0;
  for (int64_t v = first; v < num_vectors; v += stride) {
    // Cached loads: streaming ones (ForEachElement's) measured 4 % slower here (0.576 against 0.552
    // ms at 2^27 on an H100), where the pass also writes the sum.
    const uint4 a = __ldg(reinterpret_cast<const uint4*>(grad) + v);
    const uint4 b = __ldg(reinterpret_cast<const uint4*>(addend) + v);
    const uint4 s = make_uint4(SumBits(a.x, b.x), SumBits(a.y, b.y), SumBits(a.z, b.z), SumBits(a.w, b.w));
    reinterpret_cast<uint4*>(sum)[v] = s;
    visit(4 * v, s.x);
    visit(4 * v + 1, s.y);
    visit(4 * v + 2, s.z);
    visit(4 * v + 3, s.w);
  }
  for (int64_t i = num_vectors * 4 + first; i < size; i += stride) {
    sum[i] = SumBits(grad[i], addend[i]);
    visit(i, sum[i]);
  }
}

// Unpacks the slots into values and indices, and zeroes them.
template <class Format>
__global__ void UnpackSlots(unsigned long long* slots, int64_t num_slots, typename Format::Bits* values,
                            int32_t* indices) {
  WaitForPreviousKernel();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t s = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; s < num_slots; s += stride) {
    const unsigned long long word = slots[s];
    slots[s] = 0;
    indices[s] = SlotIndex(word);
    values[s] = SlotValueBits<Format>(word);
  }
}

}  // namespace

template <class Format>
cudaError_t DragonnCompressParts(const GradientPart<typename Format::Bits>* parts, int count, int64_t size,
                                 const float* threshold, const int64_t* seed, int64_t num_slots,
                                 typename Format::Bits* values, int32_t* indices, void* scratch, size_t* scratch_bytes,
                                 bool scratch_is_zero, cudaStream_t stream) {
  using Bits = typename Format::Bits;
  if (size < 0 || size > kMaxElements || num_slots < 1 || num_slots > kMaxElements || count < 1) {
    return cudaErrorInvalidValue;
  }
  for (int p = 0; p < count; ++p) {
    if (parts[p].addend != nullptr && (sizeof(Bits) != sizeof(uint32_t) || parts[p].sum == nullptr)) {
      return cudaErrorInvalidValue;
    }
  }
  ScratchCarver carver(scratch);
  unsigned long long* slots = carver.Take<unsigned long long>(num_slots);
  TFCOMP_CUDA_ANSWER_SCRATCH_QUERY(carver, scratch, scratch_bytes);

  const unsigned int slot_blocks = NumBlocks(num_slots, kThreads);
  if (!scratch_is_zero) {
    TFCOMP_CUDA_RETURN_IF_ERROR(LaunchDependent(ZeroSlots, slot_blocks, stream, slots, num_slots));
  }
  for (int p = 0; p < count; ++p) {
    const GradientPart<Bits>& part = parts[p];
    if (part.size == 0) continue;
    if constexpr (sizeof(Bits) == sizeof(uint32_t)) {
      if (part.addend != nullptr) {
        TFCOMP_CUDA_RETURN_IF_ERROR(LaunchDependent(HashSumIntoSlots, PassBlocks<uint32_t>(part.size), stream,
                                                    part.grad, part.addend, part.sum, part.size, part.offset,
                                                    threshold, seed, static_cast<uint32_t>(num_slots), slots));
      }
    }
    if (part.addend == nullptr) {
      TFCOMP_CUDA_RETURN_IF_ERROR(LaunchDependent(HashIntoSlots<Format>, PassBlocks<Bits>(part.size), stream,
                                                  part.grad, part.size, part.offset, threshold, seed,
                                                  static_cast<uint32_t>(num_slots), slots));
    }
  }
  return LaunchDependent(UnpackSlots<Format>, slot_blocks, stream, slots, num_slots, values, indices);
}

#define TFCOMP_INSTANTIATE(Format)                                                                          \
  template cudaError_t DragonnCompressParts<Format>(const GradientPart<Format::Bits>*, int, int64_t,        \
                                                    const float*, const int64_t*, int64_t, Format::Bits*, \
                                                    int32_t*, void*, size_t*, bool, cudaStream_t);
TFCOMP_FOR_EACH_FORMAT(TFCOMP_INSTANTIATE)
#undef TFCOMP_INSTANTIATE

}  // namespace cuda
}  // namespace tfcomp
