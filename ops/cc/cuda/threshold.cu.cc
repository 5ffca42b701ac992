// CUDA estimate_threshold: the k-th largest finite magnitude key of the stratified sample, found by a
// radix select on 8-bit digits from the top (4 rounds for float32, 2 for 16-bit formats) rather than
// a sort: the gather histograms the first digit, each further round histograms the next digit of the
// keys that share the digits chosen so far, and a last one-warp kernel reads the key off the
// histograms. Each round's block first re-derives the chosen digits from the earlier histograms, so
// nothing waits for the host. Exact: the same key as the CPU's selection. See tfcomp_cuda.h.
#include <algorithm>

#include "ops/cc/cuda/device_util.cuh"
#include "ops/cc/cuda/tfcomp_cuda.h"
#include "ops/cc/lib/hashing.h"
#include "ops/cc/lib/magnitude.h"
#include "ops/cc/lib/parts.h"

namespace tfcomp {
namespace cuda {
namespace {

constexpr int kDigitBits = 8;
constexpr int kBins = 1 << kDigitBits;
constexpr unsigned int kNoDigit = 0xFFFFFFFFu;  // a lane with no key to count

template <class Bits>
__host__ __device__ constexpr int NumRounds() {
  return 8 * sizeof(Bits) / kDigitBits;
}
template <class Bits>
__device__ __forceinline__ int DigitShift(int round) {
  return 8 * sizeof(Bits) - kDigitBits * (round + 1);
}

// What the rounds so far have decided.
template <class Bits>
struct Selection {
  Bits prefix;         // the digits chosen so far, in place
  int64_t remaining;   // the rank wanted among the keys that share them (1 = largest)
  bool none_finite;    // no sample is finite
};

// Run by one whole warp: the digits of rounds [0, rounds_done) from their histograms hist[round][kBins],
// for the k-th largest finite key (the smallest when fewer than k are finite). Lane l holds bins
// [kBins - 8 (l + 1), kBins - 8 l), so lanes in order walk the bins from the largest digit down.
template <class Bits>
__device__ Selection<Bits> ChooseDigits(const unsigned int* hist, int rounds_done, int64_t k) {
  constexpr int kBinsPerLane = kBins / 32;
  const int lane = threadIdx.x % 32;
  Selection<Bits> selection{0, k, false};
  for (int round = 0; round < rounds_done; ++round) {
    const unsigned int* bins = hist + round * kBins;
    const int top = kBins - 1 - kBinsPerLane * lane;  // this lane's largest bin
    int64_t own = 0;
    for (int b = 0; b < kBinsPerLane; ++b) own += bins[top - b];
    int64_t through = own;  // inclusive prefix over lanes 0..lane
    for (int offset = 1; offset < 32; offset *= 2) {
      const int64_t other = __shfl_up_sync(0xFFFFFFFFu, through, offset);
      if (lane >= offset) through += other;
    }
    if (round == 0) {
      const int64_t finite = __shfl_sync(0xFFFFFFFFu, through, 31);
      if (finite == 0) return Selection<Bits>{0, 0, true};
      if (selection.remaining > finite) selection.remaining = finite;
    }
    const int holder = __ffs(__ballot_sync(0xFFFFFFFFu, through >= selection.remaining)) - 1;
    int digit = 0;
    int64_t before = through - own;  // keys in larger digits than this lane's bins
    if (lane == holder) {
      for (int b = 0; b < kBinsPerLane; ++b) {
        if (before + bins[top - b] >= selection.remaining) {
          digit = top - b;
          break;
        }
        before += bins[top - b];
      }
    }
    digit = __shfl_sync(0xFFFFFFFFu, digit, holder);
    before = __shfl_sync(0xFFFFFFFFu, before, holder);
    selection.remaining -= before;
    selection.prefix |= static_cast<Bits>(digit) << DigitShift<Bits>(round);
  }
  return selection;
}

// Adds 1 to bins[digit] for every lane whose digit is not kNoDigit, one shared atomic per distinct
// digit of the warp. All 32 lanes call it together.
__device__ __forceinline__ void CountDigit(unsigned int digit, unsigned int* bins) {
  const unsigned int peers = __match_any_sync(0xFFFFFFFFu, digit);
  if (digit != kNoDigit && threadIdx.x % 32 == __ffs(peers) - 1) atomicAdd(bins + digit, __popc(peers));
}

// The block's shared histogram, added to the round's global one.
__device__ __forceinline__ void PublishHistogram(const unsigned int* local, unsigned int* global) {
  __syncthreads();
  for (int b = threadIdx.x; b < kBins; b += blockDim.x) {
    if (local[b] != 0) atomicAdd(global + b, local[b]);
  }
}

// For the samples i in [first, last) whose position SamplePosition(i, n, size, *seed) (i when
// n == size) falls in `part` of the gradient: keys[i] = the magnitude key of the element there (of
// grad + addend where the part has an addend, float32 only), and hist[0] += the histogram of the
// finite keys' first digits. Samples outside the part are another launch's. hist: zeroed before
// the first part's launch.
template <class Format>
__global__ void GatherSampleKeys(GradientPart<typename Format::Bits> part, int64_t size, int64_t n, int64_t first,
                                 int64_t last, const int64_t* seed, typename Format::Bits* keys, unsigned int* hist) {
  using Bits = typename Format::Bits;
  __shared__ unsigned int local[kBins];
  for (int b = threadIdx.x; b < kBins; b += blockDim.x) local[b] = 0;
  __syncthreads();
  const uint64_t sample_seed = static_cast<uint64_t>(*seed);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  // Whole warps step together (CountDigit needs every lane).
  for (int64_t base = first + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x / 32 * 32; base < last;
       base += stride) {
    const int64_t i = base + threadIdx.x % 32;
    unsigned int digit = kNoDigit;
    const int64_t position = i < last ? (n == size ? i : SamplePosition(i, n, size, sample_seed)) - part.offset : -1;
    if (position >= 0 && position < part.size) {
      Bits bits = part.grad[position];
      if constexpr (sizeof(Bits) == sizeof(uint32_t)) {
        if (part.addend != nullptr) bits = SumBits(bits, part.addend[position]);
      }
      const Bits key = MagnitudeKey<Format>(bits);
      keys[i] = key;
      if (key < Format::kInfKey) digit = key >> DigitShift<Bits>(0);
    }
    CountDigit(digit, local);
  }
  PublishHistogram(local, hist);
}

// hist[round] = the histogram of digit `round` of the finite keys that share the digits chosen in
// the rounds before (read off hist[0, round)). hist[round]: zeroed before the launch.
template <class Format>
__global__ void CountRound(const typename Format::Bits* keys, int64_t n, int64_t k, int round, unsigned int* hist) {
  using Bits = typename Format::Bits;
  __shared__ unsigned int local[kBins];
  __shared__ Selection<Bits> chosen;
  for (int b = threadIdx.x; b < kBins; b += blockDim.x) local[b] = 0;
  if (threadIdx.x < 32) {
    const Selection<Bits> selection = ChooseDigits<Bits>(hist, round, k);
    if (threadIdx.x == 0) chosen = selection;
  }
  __syncthreads();
  if (chosen.none_finite) return;
  const int shift = DigitShift<Bits>(round);
  const Bits decided = static_cast<Bits>(~((Bits{1} << (shift + kDigitBits)) - 1));  // the digits above
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x / 32 * 32; base < n;
       base += stride) {
    const int64_t i = base + threadIdx.x % 32;
    unsigned int digit = kNoDigit;
    if (i < n) {
      const Bits key = keys[i];
      if (key < Format::kInfKey && (key & decided) == chosen.prefix) digit = (key >> shift) & (kBins - 1);
    }
    CountDigit(digit, local);
  }
  PublishHistogram(local, hist + round * kBins);
}

// One warp: *threshold = the value of the key all rounds chose, or of Format::kMaxFiniteKey when no
// sample is finite.
template <class Format>
__global__ void WriteThreshold(const unsigned int* hist, int64_t k, float* threshold) {
  using Bits = typename Format::Bits;
  const Selection<Bits> selection = ChooseDigits<Bits>(hist, NumRounds<Bits>(), k);
  if (threadIdx.x == 0) {
    *threshold = Format::KeyToFloat(selection.none_finite ? Format::kMaxFiniteKey : selection.prefix);
  }
}

}  // namespace

template <class Format>
cudaError_t EstimateThresholdParts(const GradientPart<typename Format::Bits>* parts, int count, int64_t size,
                                   int64_t n, int64_t k, const int64_t* seed, float* threshold, void* scratch,
                                   size_t* scratch_bytes, cudaStream_t stream) {
  using Bits = typename Format::Bits;
  constexpr int kRounds = NumRounds<Bits>();
  if (size < 1 || n < 1 || n > size || n > kMaxElements || k < 1 || count < 1) return cudaErrorInvalidValue;
  for (int p = 0; p < count; ++p) {
    if (parts[p].addend != nullptr && sizeof(Bits) != sizeof(uint32_t)) return cudaErrorInvalidValue;
  }
  ScratchCarver carver(scratch);
  Bits* keys = carver.Take<Bits>(n);
  unsigned int* hist = carver.Take<unsigned int>(kRounds * kBins);
  TFCOMP_CUDA_ANSWER_SCRATCH_QUERY(carver, scratch, scratch_bytes);

  TFCOMP_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(hist, 0, kRounds * kBins * sizeof(*hist), stream));
  for (int p = 0; p < count; ++p) {
    const GradientPart<Bits>& part = parts[p];
    if (part.size == 0) continue;
    // The strata that can hold a position of the part (a stratum spans size / n positions): a few
    // more than needed at each end, the kernel checks each position.
    const int64_t first = std::max<int64_t>(0, part.offset * n / size - 1);
    const int64_t last = std::min<int64_t>(n, (part.offset + part.size) * n / size + 2);
    GatherSampleKeys<Format><<<NumBlocks(last - first, kThreads * 2), kThreads, 0, stream>>>(  // latency-bound
        part, size, n, first, last, seed, keys, hist);
    TFCOMP_CUDA_RETURN_IF_LAUNCH_FAILED();
  }
  const unsigned int blocks = NumBlocks(n, kThreads * 2);  // latency-bound: many blocks
  for (int round = 1; round < kRounds; ++round) {
    CountRound<Format><<<blocks, kThreads, 0, stream>>>(keys, n, k, round, hist);
    TFCOMP_CUDA_RETURN_IF_LAUNCH_FAILED();
  }
  WriteThreshold<Format><<<1, 32, 0, stream>>>(hist, k, threshold);
  TFCOMP_CUDA_RETURN_IF_LAUNCH_FAILED();
  return cudaSuccess;
}

#define TFCOMP_INSTANTIATE(Format)                                                                              \
  template cudaError_t EstimateThresholdParts<Format>(const GradientPart<Format::Bits>*, int, int64_t, int64_t, \
                                                      int64_t, const int64_t*, float*, void*, size_t*, cudaStream_t);
TFCOMP_FOR_EACH_FORMAT(TFCOMP_INSTANTIATE)
#undef TFCOMP_INSTANTIATE

}  // namespace cuda
}  // namespace tfcomp
