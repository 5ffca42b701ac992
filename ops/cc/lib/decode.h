// Sparse batched decoding (004 Sec. 4.3) on the CPU, framework-free.
#ifndef TFCOMP_OPS_CC_LIB_DECODE_H_
#define TFCOMP_OPS_CC_LIB_DECODE_H_

#include <cstdint>

namespace tfcomp {

// Position of the first index outside [-1, size), or -1 when every index is valid.
inline int64_t FirstInvalidIndex(const int32_t* indices, int64_t n, int64_t size) {
  for (int64_t p = 0; p < n; ++p) {
    if (indices[p] < -1 || indices[p] >= size) return p;
  }
  return -1;
}

// Zeroes dense[lo, hi) and adds every pair whose index falls in [lo, hi), in pair order, so that
// threads owning disjoint output ranges never race and the sum is deterministic. Index -1 falls
// outside every range and is skipped. Indices must have been validated.
template <typename T>
inline void ScatterAddOwnedRange(const T* values, const int32_t* indices, int64_t n, int64_t lo,
                                 int64_t hi, T* dense) {
  for (int64_t i = lo; i < hi; ++i) dense[i] = T(0);
  for (int64_t p = 0; p < n; ++p) {
    const int64_t index = indices[p];
    if (index >= lo && index < hi) dense[index] += values[p];
  }
}

}  // namespace tfcomp

#endif  // TFCOMP_OPS_CC_LIB_DECODE_H_
