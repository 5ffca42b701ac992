// hash_partition's core: which rank owns a flat index, and a stable counting sort of pairs by owner.
#ifndef TFCOMP_OPS_CC_LIB_PARTITION_H_
#define TFCOMP_OPS_CC_LIB_PARTITION_H_

#include <cstdint>

#include "ops/cc/lib/magnitude.h"

namespace tfcomp {

// The part in [0, num_parts) that owns flat index `index` >= 0: Fibonacci hashing (the index times
// 2^32 / golden ratio, mod 2^32) reduced to the range by a multiply-shift, the same on every rank
// and device, so that neighbouring indices (one layer's) spread over all parts.
TFCOMP_HOST_DEVICE inline int32_t HashOwner(int32_t index, int32_t num_parts) {
  const uint32_t mixed = static_cast<uint32_t>(index) * 2654435761u;
  return static_cast<int32_t>((static_cast<uint64_t>(mixed) * static_cast<uint64_t>(num_parts)) >> 32);
}

// Counts, in counts[0, num_parts), the pairs with index >= 0 per owner; returns the position of the
// first index < -1, or -1 when there is none (counts are then complete).
inline int64_t CountPairsPerOwner(const int32_t* indices, int64_t n, int32_t num_parts, int32_t* counts) {
  for (int32_t p = 0; p < num_parts; ++p) counts[p] = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (indices[i] >= 0) {
      ++counts[HashOwner(indices[i], num_parts)];
    } else if (indices[i] < -1) {
      return i;
    }
  }
  return -1;
}

// rows[2 r] = index, rows[2 r + 1] = the value's bits, for the pairs with index >= 0, owner by
// owner (owner p's rows start at the sum of counts[0, p)), in input order within an owner. counts
// (num_parts entries, CountPairsPerOwner's, at most 2^31 - 1 in all) serve as the owners' cursors and
// are restored before the return: no scratch, O(n + num_parts) time.
inline void WriteRowsByOwner(const float* values, const int32_t* indices, int64_t n, int32_t num_parts,
                             int32_t* counts, int32_t* rows) {
  int32_t start = 0;
  for (int32_t p = 0; p < num_parts; ++p) {
    const int32_t count = counts[p];
    counts[p] = start;
    start += count;
  }
  for (int64_t i = 0; i < n; ++i) {
    if (indices[i] < 0) continue;
    const int64_t row = counts[HashOwner(indices[i], num_parts)]++;
    rows[2 * row] = indices[i];
    rows[2 * row + 1] = static_cast<int32_t>(FloatToBits(values[i]));
  }
  // Each cursor now holds its owner's end, the next owner's start: the differences are the counts.
  for (int32_t p = num_parts - 1; p > 0; --p) counts[p] -= counts[p - 1];
}

}  // namespace tfcomp

#endif  // TFCOMP_OPS_CC_LIB_PARTITION_H_
