// Seeded hashing shared by the CPU and CUDA kernels, framework-free.
#ifndef TFCOMP_OPS_CC_LIB_HASHING_H_
#define TFCOMP_OPS_CC_LIB_HASHING_H_

#include <cmath>
#include <cstdint>

#include "ops/cc/lib/magnitude.h"

namespace tfcomp {

// SplitMix64's finaliser: a bijective 64-bit mixer used to expand seeds.
TFCOMP_HOST_DEVICE inline uint64_t Mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Maps r in [0, 2^32) to [0, n) without a division (Lemire's multiply-shift range reduction).
TFCOMP_HOST_DEVICE inline uint32_t ReduceToRange(uint32_t r, uint32_t n) {
  return static_cast<uint32_t>((static_cast<uint64_t>(r) * n) >> 32);
}

// A member of the multiply-add-shift universal family (Dietzfelbinger 1996) composed with range
// reduction:  h(i) = ((a * i + b) mod 2^64) >> 32, reduced to [0, num_slots).
// For 32-bit keys and uniformly random 64-bit a, b the 32-bit hash is strongly universal, so two
// distinct indices collide with probability 1/num_slots up to a num_slots / 2^32 rounding term.
// Each seed picks a different (a, b) and so a different collision pattern.
struct SlotHash {
  uint64_t multiplier;
  uint64_t increment;
  uint32_t num_slots;

  TFCOMP_HOST_DEVICE static SlotHash FromSeed(uint64_t seed, uint32_t num_slots) {
    SlotHash h;
    h.multiplier = Mix64(seed ^ 0xD1B54A32D192ED03ull) | 1ull;
    h.increment = Mix64(seed + 0x632BE59BD9B4E019ull);
    h.num_slots = num_slots;
    return h;
  }

  TFCOMP_HOST_DEVICE uint32_t operator()(uint32_t index) const {
    const uint32_t h32 = static_cast<uint32_t>((multiplier * index + increment) >> 32);
    return ReduceToRange(h32, num_slots);
  }
};

// Position of sample i of n drawn from [0, size): sample i is uniform within its stratum
// [i * size / n, (i + 1) * size / n), so the sample covers the tensor evenly and does not alias
// with periodic structure (rows, channels) the way a fixed stride can. Requires n <= size.
TFCOMP_HOST_DEVICE inline int64_t SamplePosition(int64_t i, int64_t n, int64_t size, uint64_t seed) {
  const int64_t lo = i * size / n;
  const int64_t hi = (i + 1) * size / n;
  const uint32_t r = static_cast<uint32_t>(Mix64(seed ^ Mix64(static_cast<uint64_t>(i))) >> 32);
  return lo + ReduceToRange(r, static_cast<uint32_t>(hi - lo));
}

// The rank k of the threshold among n samples for a kept fraction `ratio`: max(1, round(ratio * n)),
// halves rounded up, computed in double as the op documentation states.
inline int64_t SampleRank(float ratio, int64_t n) {
  const int64_t k = static_cast<int64_t>(std::floor(static_cast<double>(ratio) * n + 0.5));
  return k < 1 ? 1 : k;
}

}  // namespace tfcomp

#endif  // TFCOMP_OPS_CC_LIB_HASHING_H_
