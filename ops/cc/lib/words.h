// Packed 64-bit words that carry an element's magnitude key and index, shared by the CPU and CUDA
// kernels, framework-free. Comparing words as unsigned integers implements the ordering rules.
#ifndef TFCOMP_OPS_CC_LIB_WORDS_H_
#define TFCOMP_OPS_CC_LIB_WORDS_H_

#include <cstdint>

#include "ops/cc/lib/magnitude.h"

namespace tfcomp {

// dragonn_compress (004 Algorithm 1).

// Slot contents while hashing: 0 for an empty slot, else
//   (magnitude key + 1) << 32  |  index << 1  |  sign bit.
// The larger word wins a slot, so on a collision the element of larger magnitude keeps the slot
// (NaN above Inf above finite), and among equal magnitudes the larger index (004 Lemma A.5); the
// outcome does not depend on thread timing. The word also holds the winner's exact value (key and
// sign), so the output needs no second, random read of the gradient. Indices are < 2^31.
template <class Format>
TFCOMP_HOST_DEVICE inline uint64_t SlotWord(typename Format::Bits bits, int64_t index) {
  constexpr int kSignShift = 8 * sizeof(typename Format::Bits) - 1;
  return (static_cast<uint64_t>(MagnitudeKey<Format>(bits)) + 1) << 32 |
         static_cast<uint64_t>(static_cast<uint32_t>(index)) << 1 | ((bits >> kSignShift) & 1);
}

// The index held by a slot word, -1 for an empty slot.
TFCOMP_HOST_DEVICE inline int32_t SlotIndex(uint64_t word) {
  return word == 0 ? -1 : static_cast<int32_t>(static_cast<uint32_t>(word) >> 1);
}

// The raw bits of the value held by a slot word (+0 for an empty slot).
template <class Format>
TFCOMP_HOST_DEVICE inline typename Format::Bits SlotValueBits(uint64_t word) {
  using Bits = typename Format::Bits;
  constexpr int kSignShift = 8 * sizeof(Bits) - 1;
  if (word == 0) return 0;
  return static_cast<Bits>(((word >> 32) - 1) | (word & 1) << kSignShift);
}

// topk_compress: exact top-k by magnitude.

// Rank words: magnitude key << 32 | index; larger is better (ties go to the larger index).
template <class Format>
TFCOMP_HOST_DEVICE inline uint64_t RankWord(typename Format::Bits bits, int64_t index) {
  return static_cast<uint64_t>(MagnitudeKey<Format>(bits)) << 32 | static_cast<uint32_t>(index);
}

}  // namespace tfcomp

#endif  // TFCOMP_OPS_CC_LIB_WORDS_H_
