// A gradient given as several tensors, read in place: the tensors of one MergeComp bucket are one
// gradient, their concatenation, which no kernel has to build. Framework-free (CPU and CUDA).
#ifndef TFCOMP_OPS_CC_LIB_PARTS_H_
#define TFCOMP_OPS_CC_LIB_PARTS_H_

#include <cstdint>

namespace tfcomp {

// Part p of a gradient: its elements [offset, offset + size) are grad[0, size). Parts are given in
// order, contiguous, starting at offset 0. With an addend (float32 only, the part's error-feedback
// residual), the elements are grad + addend, written to sum in the pass that reads them.
template <class Bits>
struct GradientPart {
  const Bits* grad;
  const Bits* addend;  // null: no addend
  Bits* sum;           // with an addend: where grad + addend goes; else null
  int64_t offset;
  int64_t size;
};

// The index of the part that holds `position` (0 <= position < the parts' total size): the last
// part whose offset is <= position, skipping empty parts. Binary search over `count` parts.
template <class Bits>
inline int PartAt(const GradientPart<Bits>* parts, int count, int64_t position) {
  int lo = 0, hi = count - 1;  // the answer lies in [lo, hi]
  while (lo < hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    if (parts[mid].offset <= position) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  while (parts[lo].size == 0) ++lo;  // an empty part shares its offset with the next one
  return lo;
}

}  // namespace tfcomp

#endif  // TFCOMP_OPS_CC_LIB_PARTS_H_
