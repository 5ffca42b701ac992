// sum_pairs's core: the owner's step of the hash-partitioned sparse allreduce. Rows (index, float32
// bits) from every worker are summed per index in row order, and at most max_pairs sums are kept:
// the largest in magnitude, ties to the lower index (SelectionKey orders them).
#ifndef TFCOMP_OPS_CC_LIB_SUM_PAIRS_H_
#define TFCOMP_OPS_CC_LIB_SUM_PAIRS_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "ops/cc/lib/magnitude.h"

namespace tfcomp {

// A key per distinct index that orders the sums as sum_pairs keeps them: ascending keys are
// descending magnitudes (|x|'s bits: NaN above +Inf above every finite value), equal magnitudes by
// ascending index. Keys of distinct indices differ, so the max_pairs smallest are one set.
TFCOMP_HOST_DEVICE inline uint64_t SelectionKey(int32_t index, uint32_t sum_bits) {
  const uint32_t magnitude = sum_bits & 0x7FFFFFFFu;
  return (static_cast<uint64_t>(0x7FFFFFFFu - magnitude) << 32) | static_cast<uint32_t>(index);
}

// The first row whose index is negative, or -1 when there is none.
inline int64_t FirstNegativeRowIndex(const int32_t* rows, int64_t n) {
  for (int64_t r = 0; r < n; ++r) {
    if (rows[2 * r] < 0) return r;
  }
  return -1;
}

// keyed[0, n) = (index << 32 | row) of every row, stably sorted by index (indices >= 0): least
// significant digit first, 11 bits a pass, the three passes' counts taken in one read, a pass
// skipped where every index has the same digit. `scratch` has n entries.
inline void SortRowsByIndex(const int32_t* rows, int64_t n, uint64_t* keyed, uint64_t* scratch) {
  constexpr int kDigitBits = 11;
  constexpr int kPasses = 3;  // 33 bits cover the 31 of an index >= 0
  constexpr uint32_t kDigits = 1u << kDigitBits;
  std::vector<int64_t> start(kPasses * kDigits, 0);
  for (int64_t r = 0; r < n; ++r) {
    const uint32_t index = static_cast<uint32_t>(rows[2 * r]);
    keyed[r] = (static_cast<uint64_t>(index) << 32) | static_cast<uint64_t>(r);
    for (int p = 0; p < kPasses; ++p) ++start[p * kDigits + ((index >> (p * kDigitBits)) & (kDigits - 1))];
  }
  for (int p = 0; p < kPasses; ++p) {
    int64_t* counts = start.data() + p * kDigits;
    if (n == 0 || *std::max_element(counts, counts + kDigits) == n) continue;
    int64_t total = 0;
    for (uint32_t d = 0; d < kDigits; ++d) {
      const int64_t count = counts[d];
      counts[d] = total;
      total += count;
    }
    const int shift = 32 + p * kDigitBits;
    for (int64_t i = 0; i < n; ++i) scratch[counts[(keyed[i] >> shift) & (kDigits - 1)]++] = keyed[i];
    std::copy(scratch, scratch + n, keyed);
  }
}

// For rows sorted by SortRowsByIndex (`keyed`), writes each distinct index and the float32 bits of
// the sum of its values, in row order (0, plus the first value, plus the next, ...: as TensorFlow's
// unsorted_segment_sum adds them), to sums[2 m] and sums[2 m + 1], in ascending index order;
// returns the number m of distinct indices.
inline int64_t SumRowsPerIndex(const int32_t* rows, int64_t n, const uint64_t* keyed, int32_t* sums) {
  int64_t m = 0;
  for (int64_t i = 0; i < n;) {
    const uint32_t index = static_cast<uint32_t>(keyed[i] >> 32);
    float sum = 0.0f;
    for (; i < n && static_cast<uint32_t>(keyed[i] >> 32) == index; ++i) {
      sum = sum + BitsToFloat(static_cast<uint32_t>(rows[2 * static_cast<uint32_t>(keyed[i]) + 1]));
    }
    sums[2 * m] = static_cast<int32_t>(index);
    sums[2 * m + 1] = static_cast<int32_t>(FloatToBits(sum));
    ++m;
  }
  return m;
}

// Writes to kept_rows the `kept` of the m (index, sum bits) rows `sums` (SumRowsPerIndex's) whose
// SelectionKeys are smallest, in their order in sums (0 <= kept <= m; all of them when kept == m).
inline void KeepSmallestKeys(const int32_t* sums, int64_t m, int64_t kept, int32_t* kept_rows) {
  if (kept >= m) {
    std::copy(sums, sums + 2 * m, kept_rows);
    return;
  }
  if (kept <= 0) return;
  std::vector<uint64_t> keys(m);
  for (int64_t i = 0; i < m; ++i) keys[i] = SelectionKey(sums[2 * i], static_cast<uint32_t>(sums[2 * i + 1]));
  std::nth_element(keys.begin(), keys.begin() + (kept - 1), keys.end());
  const uint64_t limit = keys[kept - 1];
  for (int64_t i = 0, k = 0; i < m; ++i) {
    if (SelectionKey(sums[2 * i], static_cast<uint32_t>(sums[2 * i + 1])) <= limit) {
      kept_rows[2 * k] = sums[2 * i];
      kept_rows[2 * k + 1] = sums[2 * i + 1];
      ++k;
    }
  }
}

}  // namespace tfcomp

#endif  // TFCOMP_OPS_CC_LIB_SUM_PAIRS_H_
