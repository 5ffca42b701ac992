// zero_at's core: clears the elements of a flat buffer that a list of flat indices names.
#ifndef TFCOMP_OPS_CC_LIB_ZERO_AT_H_
#define TFCOMP_OPS_CC_LIB_ZERO_AT_H_

#include <cstdint>

namespace tfcomp {

// data[i - offset] = 0 for every i = indices[p], p in [0, n), with offset <= i < offset + size; the
// other indices (-1, those of other tensors) are skipped.
inline void ZeroAt(float* data, int64_t size, const int32_t* indices, int64_t n, int64_t offset) {
  for (int64_t p = 0; p < n; ++p) {
    const int64_t i = static_cast<int64_t>(indices[p]) - offset;
    if (i >= 0 && i < size) data[i] = 0.0f;
  }
}

}  // namespace tfcomp

#endif  // TFCOMP_OPS_CC_LIB_ZERO_AT_H_
