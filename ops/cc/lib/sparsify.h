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

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "ops/cc/lib/hashing.h"
#include "ops/cc/lib/magnitude.h"
#include "ops/cc/lib/words.h"

namespace tfcomp {

// Bit j of the result is set when x[j] is selected, for j in [0, 16). Portable version.
template <class Format>
inline uint32_t SelectedMask16Portable(const typename Format::Bits* x, typename Format::Bits threshold_key) {
  uint32_t mask = 0;
  for (int j = 0; j < 16; ++j) mask |= static_cast<uint32_t>(IsSelected<Format>(x[j], threshold_key)) << j;
  return mask;
}

#if defined(__SSE2__)
// SSE2 (every x86-64 CPU): |x| >= t as a signed compare of the sign-cleared bits against t - 1, and
// the 16 compare results packed into one 16-bit mask.
inline uint32_t SelectedMask16Sse2(const uint32_t* x, uint32_t threshold_key) {
  const __m128i abs_mask = _mm_set1_epi32(0x7FFFFFFF);
  const __m128i below = _mm_set1_epi32(static_cast<int32_t>(threshold_key) - 1);
  __m128i c[4];
  for (int q = 0; q < 4; ++q) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + 4 * q));
    c[q] = _mm_cmpgt_epi32(_mm_and_si128(v, abs_mask), below);
  }
  const __m128i packed = _mm_packs_epi16(_mm_packs_epi32(c[0], c[1]), _mm_packs_epi32(c[2], c[3]));
  return static_cast<uint32_t>(_mm_movemask_epi8(packed));
}

inline uint32_t SelectedMask16Sse2(const uint16_t* x, uint16_t threshold_key) {
  const __m128i abs_mask = _mm_set1_epi16(0x7FFF);
  const __m128i below = _mm_set1_epi16(static_cast<int16_t>(threshold_key - 1));
  const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x));
  const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + 8));
  const __m128i packed = _mm_packs_epi16(_mm_cmpgt_epi16(_mm_and_si128(lo, abs_mask), below),
                                         _mm_cmpgt_epi16(_mm_and_si128(hi, abs_mask), below));
  return static_cast<uint32_t>(_mm_movemask_epi8(packed));
}
#endif

// Bit j of the result is set when x[j] is selected (|x[j]| >= threshold, NaN and Inf included).
template <class Format>
inline uint32_t SelectedMask16(const typename Format::Bits* x, typename Format::Bits threshold_key) {
#if defined(__SSE2__)
  return SelectedMask16Sse2(x, threshold_key);
#else
  return SelectedMask16Portable<Format>(x, threshold_key);
#endif
}

// Calls visit(i) for every i in [begin, end) with |g[i]| >= threshold (NaN and Inf included), in
// increasing order of i. Returns early, with false, as soon as visit returns false.
// Sixteen elements are compared at a time into a bit mask; only its set bits are visited, so the
// scan costs one vector compare per element plus a few instructions per selected element.
template <class Format, class Visit>
inline bool ForEachSelected(const typename Format::Bits* g, int64_t begin, int64_t end,
                            typename Format::Bits threshold_key, Visit&& visit) {
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    for (uint32_t mask = SelectedMask16<Format>(g + i, threshold_key); mask != 0; mask &= mask - 1) {
      if (!visit(i + __builtin_ctz(mask))) return false;
    }
  }
  for (; i < end; ++i) {
    if (IsSelected<Format>(g[i], threshold_key) && !visit(i)) return false;
  }
  return true;
}

// Writes block[j] and sum[j] = bits of g[j] + r[j] for j in [0, 16) and returns the mask of the
// selected sums. With SSE2, sum (16-byte aligned) is written by non-temporal stores, which skip
// reading its cache lines first: the sum is not read again in the pass (error feedback keeps it as
// the residual and clears k of its elements), so a plain store's read for ownership would add a
// third stream of reads to the two the sum needs. The caller fences the stores (_mm_sfence).
inline uint32_t SumAndSelectedMask16(const uint32_t* g, const uint32_t* r, uint32_t* sum, uint32_t* block,
                                     uint32_t threshold_key) {
#if defined(__SSE2__)
  for (int q = 0; q < 4; ++q) {
    const __m128 a = _mm_loadu_ps(reinterpret_cast<const float*>(g + 4 * q));
    const __m128 b = _mm_loadu_ps(reinterpret_cast<const float*>(r + 4 * q));
    const __m128 s = _mm_add_ps(a, b);
    _mm_storeu_ps(reinterpret_cast<float*>(block + 4 * q), s);
    _mm_stream_ps(reinterpret_cast<float*>(sum + 4 * q), s);
  }
#else
  for (int j = 0; j < 16; ++j) sum[j] = block[j] = SumBits(g[j], r[j]);
#endif
  return SelectedMask16<Float32Format>(block, threshold_key);
}

// ForEachSelected over s = g + r (float32, element by element), which it writes to sum: visit(i,
// bits of s[i]) for every selected i in [begin, end), in increasing order. Error feedback's
// gradient plus residual thus costs one pass that reads both and writes the sum (with SSE2 by
// non-temporal stores, blocks of 16 from the first 16-byte boundary of sum on).
template <class Visit>
inline void ForEachSelectedSum(const uint32_t* g, const uint32_t* r, uint32_t* sum, int64_t begin, int64_t end,
                               uint32_t threshold_key, Visit&& visit) {
  int64_t i = begin;
  const auto scalar_until = [&](int64_t stop) {
    for (; i < stop; ++i) {
      sum[i] = SumBits(g[i], r[i]);
      if (IsSelected<Float32Format>(sum[i], threshold_key)) visit(i, sum[i]);
    }
  };
#if defined(__SSE2__)
  const int64_t past_boundary = static_cast<int64_t>(reinterpret_cast<uintptr_t>(sum + i) % 16 / sizeof(uint32_t));
  scalar_until(std::min(end, i + (4 - past_boundary) % 4));
#endif
  uint32_t block[16];
  for (; i + 16 <= end; i += 16) {
    for (uint32_t mask = SumAndSelectedMask16(g + i, r + i, sum + i, block, threshold_key); mask != 0;
         mask &= mask - 1) {
      const int j = __builtin_ctz(mask);
      visit(i + j, block[j]);
    }
  }
#if defined(__SSE2__)
  _mm_sfence();
#endif
  scalar_until(end);
}

// ---------------------------------------------------------------------------------------------
// estimate_threshold: stratified random sample (SamplePosition in hashing.h) + selection.

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

// Appends the slot words of the selected elements of g[begin, end) to out, in index order, each
// element i indexed i + index_offset (g: one part of a gradient, at that offset).
template <class Format>
inline void DragonnCollectRange(const typename Format::Bits* g, int64_t begin, int64_t end,
                                typename Format::Bits threshold_key, std::vector<uint64_t>* out,
                                int64_t index_offset = 0) {
  ForEachSelected<Format>(g, begin, end, threshold_key, [&](int64_t i) {
    out->push_back(SlotWord<Format>(g[i], i + index_offset));
    return true;
  });
}

// DragonnCollectRange over float32 g + r, which it writes to sum[begin, end) in the same pass.
inline void DragonnCollectRangeSum(const uint32_t* g, const uint32_t* r, uint32_t* sum, int64_t begin, int64_t end,
                                   uint32_t threshold_key, std::vector<uint64_t>* out, int64_t index_offset = 0) {
  ForEachSelectedSum(g, r, sum, begin, end, threshold_key, [&](int64_t i, uint32_t bits) {
    out->push_back(SlotWord<Float32Format>(bits, i + index_offset));
  });
}

// Hashes the collected words into the slots [slot_begin, slot_end) of `slots`, keeping the larger
// word per slot; words whose slot lies outside that range are left to another caller, so disjoint
// slot ranges can be filled concurrently. The result does not depend on the order of the words.
inline void DragonnFillSlots(const uint64_t* words, int64_t num_words, const SlotHash& hash,
                             uint32_t slot_begin, uint32_t slot_end, uint64_t* slots) {
  for (int64_t w = 0; w < num_words; ++w) {
    const uint32_t slot = hash(static_cast<uint32_t>(SlotIndex(words[w])));
    if (slot - slot_begin < slot_end - slot_begin && words[w] > slots[slot]) slots[slot] = words[w];
  }
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
