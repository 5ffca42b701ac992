// The math of the sparsifying kernels on the CPU, framework-free: raw pointers and index ranges.
// The op kernels (ops/cc/kernels/) only adapt tensors and split ranges across threads.
// Gradients are read as raw bits (uint32_t for float32, uint16_t for float16/bfloat16) and compared
// as magnitude keys (see magnitude.h).
#ifndef TFCOMP_OPS_CC_LIB_SPARSIFY_H_
#define TFCOMP_OPS_CC_LIB_SPARSIFY_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "ops/cc/lib/hashing.h"
#include "ops/cc/lib/magnitude.h"

namespace tfcomp {

// Elements scanned per compare block: a block is skipped after one vectorised compare when none of
// its elements reaches the threshold, which is the common case at small ratios.
template <class Format>
constexpr int kScanBlock = 256 / sizeof(typename Format::Bits);

// True when some element of x[0, kScanBlock) is selected. Written to auto-vectorise.
template <class Format>
inline bool AnySelectedInBlock(const typename Format::Bits* x, typename Format::Bits threshold_key) {
  using S = typename Format::SignedBits;
  S any = 0;
  for (int j = 0; j < kScanBlock<Format>; ++j) {
    any |= static_cast<S>(IsSelected<Format>(x[j], threshold_key));
  }
  return any != 0;
}

// Calls visit(i) for every i in [begin, end) with |g[i]| >= threshold (NaN and Inf included), in
// increasing order of i. Returns early, with false, as soon as visit returns false.
template <class Format, class Visit>
inline bool ForEachSelected(const typename Format::Bits* g, int64_t begin, int64_t end,
                            typename Format::Bits threshold_key, Visit&& visit) {
  constexpr int kBlock = kScanBlock<Format>;
  int64_t i = begin;
  for (; i + kBlock <= end; i += kBlock) {
    if (!AnySelectedInBlock<Format>(g + i, threshold_key)) continue;
    for (int64_t j = i; j < i + kBlock; ++j) {
      if (IsSelected<Format>(g[j], threshold_key) && !visit(j)) return false;
    }
  }
  for (; i < end; ++i) {
    if (IsSelected<Format>(g[i], threshold_key) && !visit(i)) return false;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// estimate_threshold: stratified random sample + selection.

// Position of sample i of n drawn from [0, size): sample i is uniform within its stratum
// [i * size / n, (i + 1) * size / n), so the sample covers the tensor evenly and does not alias
// with periodic structure (rows, channels) the way a fixed stride can. Requires n <= size.
inline int64_t SamplePosition(int64_t i, int64_t n, int64_t size, uint64_t seed) {
  const int64_t lo = i * size / n;
  const int64_t hi = (i + 1) * size / n;
  const uint32_t r = static_cast<uint32_t>(Mix64(seed ^ Mix64(static_cast<uint64_t>(i))) >> 32);
  return lo + ReduceToRange(r, static_cast<uint32_t>(hi - lo));
}

// The k-th largest finite key of keys[0, n) (k >= 1), reordering keys. Non-finite keys are left out:
// the compressors select NaN and Inf whatever the threshold. With fewer than k finite keys it is
// the smallest finite key; with none, Format::kMaxFiniteKey (so only non-finite elements pass).
template <class Format>
inline typename Format::Bits KthLargestFiniteKey(typename Format::Bits* keys, int64_t n, int64_t k) {
  using Bits = typename Format::Bits;
  Bits* finite_end = std::partition(keys, keys + n, [](Bits key) { return key < Format::kInfKey; });
  const int64_t num_finite = finite_end - keys;
  if (num_finite == 0) return Format::kMaxFiniteKey;
  const int64_t kth = std::min(k, num_finite) - 1;
  std::nth_element(keys, keys + kth, finite_end, std::greater<Bits>());
  return keys[kth];
}

// ---------------------------------------------------------------------------------------------
// dragonn_compress (004 Algorithm 1).

// Slot contents while hashing: 0 for an empty slot, else (magnitude key + 1) << 32 | index.
// The larger word wins a slot, so on a collision the element of larger magnitude keeps the slot
// (NaN above Inf above finite), and among equal magnitudes the larger index (004 Lemma A.5).
// The outcome does not depend on thread timing.
template <class Format>
inline uint64_t SlotWord(typename Format::Bits key, int64_t index) {
  return (static_cast<uint64_t>(key) + 1) << 32 | static_cast<uint32_t>(index);
}

inline void AtomicMax(uint64_t* slot, uint64_t word) {
  uint64_t current = __atomic_load_n(slot, __ATOMIC_RELAXED);
  while (current < word &&
         !__atomic_compare_exchange_n(slot, &current, word, /*weak=*/true, __ATOMIC_RELAXED,
                                      __ATOMIC_RELAXED)) {
  }
}

// Hashes every selected index of g[begin, end) into slots[0, hash.num_slots). Thread-safe for
// disjoint ranges over the same slots.
template <class Format>
inline void DragonnHashRange(const typename Format::Bits* g, int64_t begin, int64_t end,
                             typename Format::Bits threshold_key, const SlotHash& hash, uint64_t* slots) {
  ForEachSelected<Format>(g, begin, end, threshold_key, [&](int64_t i) {
    AtomicMax(&slots[hash(static_cast<uint32_t>(i))], SlotWord<Format>(MagnitudeKey<Format>(g[i]), i));
    return true;
  });
}

// The index held by a slot word, -1 for an empty slot.
inline int32_t SlotIndex(uint64_t word) {
  return word == 0 ? -1 : static_cast<int32_t>(static_cast<uint32_t>(word));
}

// ---------------------------------------------------------------------------------------------
// dgc_compress (004 Algorithm 3): selected indices in index order.

// Appends the selected indices of g[begin, end), in order, to out until it holds max_out.
template <class Format>
inline void DgcCollectRange(const typename Format::Bits* g, int64_t begin, int64_t end,
                            typename Format::Bits threshold_key, int64_t max_out,
                            std::vector<int32_t>* out) {
  if (static_cast<int64_t>(out->size()) >= max_out) return;
  ForEachSelected<Format>(g, begin, end, threshold_key, [&](int64_t i) {
    out->push_back(static_cast<int32_t>(i));
    return static_cast<int64_t>(out->size()) < max_out;
  });
}

// ---------------------------------------------------------------------------------------------
// topk_compress: exact top-k by magnitude.

// Rank words: magnitude key << 32 | index; larger is better (ties go to the larger index).
template <class Format>
inline uint64_t RankWord(typename Format::Bits bits, int64_t index) {
  return static_cast<uint64_t>(MagnitudeKey<Format>(bits)) << 32 | static_cast<uint32_t>(index);
}

// Keeps the k largest words of words[0, n) in words[0, min(k, n)) (unordered); returns that count.
inline int64_t KeepLargest(uint64_t* words, int64_t n, int64_t k) {
  if (n > k) std::nth_element(words, words + (k - 1), words + n, std::greater<uint64_t>());
  return std::min(n, k);
}

// Appends the rank words of the k largest elements of g[begin, end) to out.
template <class Format>
inline void TopKCandidatesRange(const typename Format::Bits* g, int64_t begin, int64_t end, int64_t k,
                                std::vector<uint64_t>* out) {
  std::vector<uint64_t> words(end - begin);
  for (int64_t i = begin; i < end; ++i) words[i - begin] = RankWord<Format>(g[i], i);
  words.resize(KeepLargest(words.data(), words.size(), k));
  out->insert(out->end(), words.begin(), words.end());
}

}  // namespace tfcomp

#endif  // TFCOMP_OPS_CC_LIB_SPARSIFY_H_
