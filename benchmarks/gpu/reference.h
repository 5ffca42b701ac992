// CPU references of the five ops for the GPU harness, built from the framework-free core of the CPU
// kernels (ops/cc/lib: sparsify.h, decode.h, hashing.h, words.h) run on one thread, plus the
// comparisons the harness judges GPU outputs with. No TensorFlow, no CUDA: reference.cc is host code
// (it includes SSE intrinsics, which nvcc's device pass must not see), this header is shared.
#ifndef TFCOMP_BENCHMARKS_GPU_REFERENCE_H_
#define TFCOMP_BENCHMARKS_GPU_REFERENCE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "ops/cc/lib/magnitude.h"

namespace tfcomp {
namespace harness {

// The outputs of an encode: values as raw bits of the format, int32 indices.
template <class Format>
struct Encoded {
  std::vector<typename Format::Bits> values;
  std::vector<int32_t> indices;
};

// grad: [size] raw bits. The same arguments as the ops (ratio, seed, threshold, num_slots, ...).
template <class Format>
float RefEstimateThreshold(const std::vector<typename Format::Bits>& grad, int64_t num_samples, float ratio,
                           int64_t seed);
template <class Format>
Encoded<Format> RefDragonnCompress(const std::vector<typename Format::Bits>& grad, float threshold, int64_t seed,
                                   int64_t num_slots);
template <class Format>
Encoded<Format> RefDgcCompress(const std::vector<typename Format::Bits>& grad, float threshold, int64_t max_out);
template <class Format>
Encoded<Format> RefTopkCompress(const std::vector<typename Format::Bits>& grad, int64_t k);

// Decode in float32 (exact enough to judge 16-bit sums): dense[size] and, per element, the sum of
// the |values| added to it and their number (for the tolerance). Returns the first bad pair position,
// -1 when every index is in [-1, size).
struct DecodeReference {
  std::vector<float> dense, abs_sum;
  std::vector<int32_t> count;
};
template <class Format>
int64_t RefSparseBatchedDecode(const std::vector<typename Format::Bits>& values, const std::vector<int32_t>& indices,
                               int64_t size, DecodeReference* out);

// The float32 value of raw bits of the format.
template <class Format>
float ValueOf(typename Format::Bits bits) {
  constexpr int kSignShift = 8 * sizeof(typename Format::Bits) - 1;
  const float magnitude = Format::KeyToFloat(MagnitudeKey<Format>(bits));
  return (bits >> kSignShift) & 1 ? -magnitude : magnitude;
}

// Comparison results: `mismatches` counts differing elements, `first` describes the first one.
struct Verdict {
  int64_t mismatches = 0;
  std::string first;
  bool ok() const { return mismatches == 0; }
};

// Exact comparison of an encode's outputs (value bits and indices).
template <class Format>
Verdict CompareEncoded(const Encoded<Format>& expected, const Encoded<Format>& got);

// Decode comparison: |got - expected| <= count * eps(format) * abs_sum + 1e-30 per element, NaN
// where NaN is expected. got: raw bits from the GPU.
template <class Format>
Verdict CompareDecode(const DecodeReference& expected, const std::vector<typename Format::Bits>& got);

// The host-only self-check (no GPU needed): the reference path against naive definitions, the
// threshold-key rounding against exhaustive search, and the comparisons above against outputs that
// are deliberately corrupted or left poisoned. Prints one line per check; returns the failures.
int RunSelfCheck(uint64_t seed);

// A deterministic test gradient: random signs, exponents spanning about 10 binades, random
// mantissas, with NaN, +-Inf, zeros, subnormals and repeated magnitudes (ties) mixed in.
template <class Format>
std::vector<typename Format::Bits> MakeGradient(int64_t size, uint64_t seed);

}  // namespace harness
}  // namespace tfcomp

#endif  // TFCOMP_BENCHMARKS_GPU_REFERENCE_H_
