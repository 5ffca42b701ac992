// CPU references, comparisons and the host-only self-check of the GPU harness (see reference.h).
#include "benchmarks/gpu/reference.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <tuple>

#include "ops/cc/lib/decode.h"
#include "ops/cc/lib/hashing.h"
#include "ops/cc/lib/sparsify.h"
#include "ops/cc/lib/words.h"

namespace tfcomp {
namespace harness {

// ---------------------------------------------------------------------------------------------
// References: the CPU kernels' core functions over the whole tensor on one thread.

template <class Format>
float RefEstimateThreshold(const std::vector<typename Format::Bits>& grad, int64_t num_samples, float ratio,
                           int64_t seed) {
  const int64_t size = grad.size();
  const int64_t n = std::min<int64_t>(num_samples, size);
  std::vector<typename Format::Bits> keys(n);
  for (int64_t i = 0; i < n; ++i) {
    keys[i] = MagnitudeKey<Format>(grad[n == size ? i : SamplePosition(i, n, size, static_cast<uint64_t>(seed))]);
  }
  return Format::KeyToFloat(KthLargestFiniteKey<Format>(keys.data(), n, SampleRank(ratio, n)));
}

template <class Format>
Encoded<Format> RefDragonnCompress(const std::vector<typename Format::Bits>& grad, float threshold, int64_t seed,
                                   int64_t num_slots) {
  std::vector<uint64_t> words, slots(num_slots, 0);
  DragonnCollectRange<Format>(grad.data(), 0, grad.size(), ThresholdKey<Format>(threshold), &words);
  const SlotHash hash = SlotHash::FromSeed(static_cast<uint64_t>(seed), static_cast<uint32_t>(num_slots));
  DragonnFillSlots(words.data(), words.size(), hash, 0, static_cast<uint32_t>(num_slots), slots.data());
  Encoded<Format> out;
  for (uint64_t word : slots) {
    out.values.push_back(SlotValueBits<Format>(word));
    out.indices.push_back(SlotIndex(word));
  }
  return out;
}

template <class Format>
Encoded<Format> RefDgcCompress(const std::vector<typename Format::Bits>& grad, float threshold, int64_t max_out) {
  Encoded<Format> out;
  DgcCollectRange<Format>(grad.data(), 0, grad.size(), ThresholdKey<Format>(threshold), max_out, &out.indices);
  for (int32_t index : out.indices) out.values.push_back(grad[index]);
  out.indices.resize(max_out, -1);
  out.values.resize(max_out, 0);
  return out;
}

template <class Format>
Encoded<Format> RefTopkCompress(const std::vector<typename Format::Bits>& grad, int64_t k) {
  std::vector<uint64_t> words;
  TopKCandidatesRange<Format>(grad.data(), 0, grad.size(), k, &words);
  Encoded<Format> out;
  for (uint64_t word : words) out.indices.push_back(static_cast<int32_t>(static_cast<uint32_t>(word)));
  std::sort(out.indices.begin(), out.indices.end());
  for (int32_t index : out.indices) out.values.push_back(grad[index]);
  return out;
}

template <class Format>
int64_t RefSparseBatchedDecode(const std::vector<typename Format::Bits>& values, const std::vector<int32_t>& indices,
                               int64_t size, DecodeReference* out) {
  const int64_t n = values.size();
  std::vector<int64_t> cursor(NumDecodeChunks(size) + 1, 0);
  const int64_t bad = CountPairsPerChunk(indices.data(), 0, n, size, cursor.data());
  if (bad >= 0) return bad;
  int64_t total = 0;  // counts -> chunk starts
  for (int64_t& c : cursor) std::swap(c, total), total += c;
  const std::vector<int64_t> start = cursor;
  std::vector<float> as_float(n), sorted_values(n), abs_values(n), sorted_abs(n);
  std::vector<int32_t> sorted_indices(n);
  for (int64_t p = 0; p < n; ++p) as_float[p] = ValueOf<Format>(values[p]), abs_values[p] = std::fabs(as_float[p]);
  std::vector<int64_t> cursor_copy = cursor;
  SortPairsIntoChunks(as_float.data(), indices.data(), 0, n, cursor.data(), sorted_values.data(),
                      sorted_indices.data());
  SortPairsIntoChunks(abs_values.data(), indices.data(), 0, n, cursor_copy.data(), sorted_abs.data(),
                      sorted_indices.data());
  out->dense.assign(size, 0.0f);
  out->abs_sum.assign(size, 0.0f);
  out->count.assign(size, 0);
  for (int64_t c = 0; c + 1 < static_cast<int64_t>(start.size()); ++c) {
    FillChunk(sorted_values.data(), sorted_indices.data(), start[c], start[c + 1], c, size, out->dense.data());
    FillChunk(sorted_abs.data(), sorted_indices.data(), start[c], start[c + 1], c, size, out->abs_sum.data());
  }
  for (int64_t p = 0; p < n; ++p) {
    if (indices[p] >= 0) ++out->count[indices[p]];
  }
  return -1;
}

// ---------------------------------------------------------------------------------------------
// Comparisons.

namespace {

template <class... Args>
std::string Sprintf(const char* format, Args... args) {
  char buffer[256];
  std::snprintf(buffer, sizeof(buffer), format, args...);
  return buffer;
}

void Note(Verdict* verdict, const std::string& what) {
  if (verdict->mismatches++ == 0) verdict->first = what;
}

template <class Format>
constexpr double Epsilon() {
  return sizeof(typename Format::Bits) == 4 ? 0x1p-23 : Format::kInfKey == 0x7C00 ? 0x1p-10 : 0x1p-7;
}

}  // namespace

template <class Format>
Verdict CompareEncoded(const Encoded<Format>& expected, const Encoded<Format>& got) {
  Verdict verdict;
  if (expected.values.size() != got.values.size() || expected.indices.size() != got.indices.size()) {
    Note(&verdict, "output lengths differ");
    return verdict;
  }
  for (size_t j = 0; j < expected.indices.size(); ++j) {
    if (expected.indices[j] != got.indices[j] || expected.values[j] != got.values[j]) {
      Note(&verdict,
           Sprintf("[%zu]: expected (index %d, bits 0x%x), got (index %d, bits 0x%x)", j, expected.indices[j],
                   static_cast<unsigned>(expected.values[j]), got.indices[j], static_cast<unsigned>(got.values[j])));
    }
  }
  return verdict;
}

template <class Format>
Verdict CompareDecode(const DecodeReference& expected, const std::vector<typename Format::Bits>& got) {
  Verdict verdict;
  if (expected.dense.size() != got.size()) {
    Note(&verdict, "output lengths differ");
    return verdict;
  }
  for (size_t i = 0; i < got.size(); ++i) {
    const double want = expected.dense[i], have = ValueOf<Format>(got[i]);
    const double tolerance = (expected.count[i] + 1) * Epsilon<Format>() * expected.abs_sum[i] + 1e-30;
    const bool same = std::isnan(want)   ? std::isnan(have)
                      : std::isinf(want) ? want == have
                                         : std::fabs(have - want) <= tolerance;
    if (!same)
      Note(&verdict, Sprintf("dense[%zu]: expected %.9g, got %.9g (tolerance %.3g)", i, want, have, tolerance));
  }
  return verdict;
}

// ---------------------------------------------------------------------------------------------
// Test data.

namespace {

struct Rng {
  uint64_t state;
  uint64_t Next() { return state = Mix64(state); }
  uint32_t Below(uint32_t n) { return ReduceToRange(static_cast<uint32_t>(Next() >> 32), n); }
};

template <class Format>
constexpr int MantissaBits() {
  return sizeof(typename Format::Bits) == 4 ? 23 : Format::kInfKey == 0x7C00 ? 10 : 7;
}

}  // namespace

template <class Format>
std::vector<typename Format::Bits> MakeGradient(int64_t size, uint64_t seed) {
  using Bits = typename Format::Bits;
  constexpr int kMantissa = MantissaBits<Format>();
  constexpr uint32_t kBias = (Format::kInfKey >> kMantissa) / 2;  // 127 or 15
  constexpr int kSignShift = 8 * sizeof(Bits) - 1;
  Rng rng{seed};
  std::vector<Bits> g(size);
  for (int64_t i = 0; i < size; ++i) {
    const uint64_t r = rng.Next();
    const uint32_t exponent = kBias - 9 + static_cast<uint32_t>(r >> 60) % 11;  // 2^-9 .. 2^1
    const uint32_t mantissa = static_cast<uint32_t>(r) & ((1u << kMantissa) - 1);
    g[i] = static_cast<Bits>((r >> 40 & 1) << kSignShift | exponent << kMantissa | mantissa);
  }
  const int64_t specials = std::max<int64_t>(1, size / 5000);
  for (int64_t s = 0; s < specials && size > 0; ++s) {
    const int64_t i = rng.Below(static_cast<uint32_t>(size));
    switch (s % 6) {
      case 0:
        g[i] = static_cast<Bits>(Format::kInfKey | 1);
        break;  // NaN
      case 1:
        g[i] = static_cast<Bits>(Format::kInfKey | (s & 2 ? 1u << kSignShift : 0));
        break;  // +-Inf
      case 2:
        g[i] = 0;
        break;  // +0
      case 3:
        g[i] = static_cast<Bits>(1 + rng.Below(100));
        break;  // subnormal
      default:
        g[i] = g[rng.Below(static_cast<uint32_t>(size))] ^ static_cast<Bits>(rng.Next() & 1) << kSignShift;  // tie
    }
  }
  return g;
}

// ---------------------------------------------------------------------------------------------
// Self-check.

namespace {

int failures = 0;

void Report(const char* check, bool passed, const std::string& detail) {
  std::printf("%-58s %s%s%s\n", check, passed ? "ok" : "FAILED", detail.empty() ? "" : "  ", detail.c_str());
  if (!passed) ++failures;
}

// Naive definitions, written from the op documentation only.
template <class Format>
bool NaiveSelected(typename Format::Bits bits, float threshold) {
  const float magnitude = Format::KeyToFloat(MagnitudeKey<Format>(bits));
  return !(magnitude < threshold);  // NaN always selected
}

template <class Format>
Encoded<Format> NaiveDragonn(const std::vector<typename Format::Bits>& g, float threshold, int64_t seed,
                             int64_t num_slots) {
  const SlotHash hash = SlotHash::FromSeed(static_cast<uint64_t>(seed), static_cast<uint32_t>(num_slots));
  std::vector<int64_t> best(num_slots, -1);
  for (int64_t i = 0; i < static_cast<int64_t>(g.size()); ++i) {
    if (!NaiveSelected<Format>(g[i], threshold)) continue;
    int64_t& slot = best[hash(static_cast<uint32_t>(i))];
    if (slot < 0 ||
        std::make_tuple(MagnitudeKey<Format>(g[i]), i) > std::make_tuple(MagnitudeKey<Format>(g[slot]), slot)) {
      slot = i;
    }
  }
  Encoded<Format> out;
  for (int64_t index : best) {
    out.indices.push_back(static_cast<int32_t>(index));
    out.values.push_back(index < 0 ? 0 : g[index]);
  }
  return out;
}

template <class Format>
Encoded<Format> NaiveDgc(const std::vector<typename Format::Bits>& g, float threshold, int64_t max_out) {
  Encoded<Format> out;
  for (int64_t i = 0; i < static_cast<int64_t>(g.size()) && static_cast<int64_t>(out.indices.size()) < max_out; ++i) {
    if (NaiveSelected<Format>(g[i], threshold))
      out.indices.push_back(static_cast<int32_t>(i)), out.values.push_back(g[i]);
  }
  out.indices.resize(max_out, -1);
  out.values.resize(max_out, 0);
  return out;
}

template <class Format>
Encoded<Format> NaiveTopk(const std::vector<typename Format::Bits>& g, int64_t k) {
  std::vector<std::pair<uint32_t, int32_t>> ranked;
  for (int64_t i = 0; i < static_cast<int64_t>(g.size()); ++i) ranked.emplace_back(MagnitudeKey<Format>(g[i]), i);
  std::sort(ranked.rbegin(), ranked.rend());
  Encoded<Format> out;
  for (int64_t j = 0; j < k; ++j) out.indices.push_back(ranked[j].second);
  std::sort(out.indices.begin(), out.indices.end());
  for (int32_t index : out.indices) out.values.push_back(g[index]);
  return out;
}

template <class Format>
float NaiveThreshold(const std::vector<typename Format::Bits>& g, int64_t num_samples, float ratio, int64_t seed) {
  const int64_t size = g.size(), n = std::min<int64_t>(num_samples, size);
  std::vector<float> finite;
  for (int64_t i = 0; i < n; ++i) {
    const float v = std::fabs(ValueOf<Format>(g[n == size ? i : SamplePosition(i, n, size, seed)]));
    if (std::isfinite(v)) finite.push_back(v);
  }
  if (finite.empty()) return Format::KeyToFloat(Format::kMaxFiniteKey);
  std::sort(finite.rbegin(), finite.rend());
  const int64_t k = std::max<int64_t>(1, static_cast<int64_t>(std::floor(static_cast<double>(ratio) * n + 0.5)));
  return finite[std::min<int64_t>(k, finite.size()) - 1];
}

// Independent widening of a 16-bit key (ldexp), to check Format::KeyToFloat.
template <class Format>
float NaiveKeyToFloat(uint32_t key) {
  constexpr int kMantissa = MantissaBits<Format>();
  constexpr int kBias = (Format::kInfKey >> kMantissa) / 2;
  const uint32_t exponent = key >> kMantissa, mantissa = key & ((1u << kMantissa) - 1);
  if (key >= Format::kInfKey) return mantissa ? std::numeric_limits<float>::quiet_NaN() : INFINITY;
  if (exponent == 0) return std::ldexp(static_cast<float>(mantissa), 1 - kBias - kMantissa);
  return std::ldexp(1.0f + std::ldexp(static_cast<float>(mantissa), -kMantissa), static_cast<int>(exponent) - kBias);
}

template <class Format>
void CheckKeys(const char* name, Rng* rng) {
  // KeyToFloat on every finite key; ThresholdKey against the smallest key whose value is >= t.
  int64_t bad_widen = 0, bad_round = 0;
  for (uint32_t key = 0; key <= Format::kInfKey; ++key)
    bad_widen += Format::KeyToFloat(key) != NaiveKeyToFloat<Format>(key);
  std::vector<float> thresholds = {0.0f, -1.0f,    1e-30f,   1e-9f,    5.96e-8f, 6.1e-5f,
                                   1.0f, 65504.0f, 65505.0f, 65520.0f, 3.0e38f,  INFINITY};
  for (int j = 0; j < 2000; ++j) {
    const uint32_t key = rng->Below(Format::kInfKey);  // a value, a value nudged up, a value nudged down
    const float v = Format::KeyToFloat(static_cast<typename Format::Bits>(key));
    thresholds.push_back(v);
    thresholds.push_back(std::nextafter(v, INFINITY));
    thresholds.push_back(std::nextafter(v, 0.0f));
  }
  for (float t : thresholds) {
    uint32_t want = 0;
    while (want < Format::kInfKey && Format::KeyToFloat(want) < t) ++want;
    bad_round += ThresholdKey<Format>(t) != (t > 0.0f ? want : 0u);
  }
  Report(Sprintf("%s: KeyToFloat, all %u keys vs ldexp", name, Format::kInfKey + 1).c_str(), bad_widen == 0,
         bad_widen ? Sprintf("%lld wrong", static_cast<long long>(bad_widen)) : "");
  Report(Sprintf("%s: ThresholdKey, %zu thresholds vs exhaustive search", name, thresholds.size()).c_str(),
         bad_round == 0, bad_round ? Sprintf("%lld wrong", static_cast<long long>(bad_round)) : "");
}

template <class Format>
void CheckReferences(const char* name, Rng* rng) {
  for (int64_t size : {1, 7, 4097, 65537}) {
    const std::vector<typename Format::Bits> g = MakeGradient<Format>(size, rng->Next());
    const int64_t seed = static_cast<int64_t>(rng->Next());
    const float ratio = 0.01f;
    const float t = RefEstimateThreshold<Format>(g, 4096, ratio, seed);
    const float naive_t = NaiveThreshold<Format>(g, 4096, ratio, seed);
    Report(Sprintf("%s d=%lld: estimate_threshold vs naive", name, static_cast<long long>(size)).c_str(), t == naive_t,
           Sprintf("%.9g vs %.9g", t, naive_t));
    const int64_t slots = std::max<int64_t>(1, size / 50);
    Verdict v = CompareEncoded(NaiveDragonn<Format>(g, t, seed, slots), RefDragonnCompress<Format>(g, t, seed, slots));
    Report(Sprintf("%s d=%lld: dragonn_compress vs naive", name, static_cast<long long>(size)).c_str(), v.ok(),
           v.first);
    v = CompareEncoded(NaiveDgc<Format>(g, t, slots), RefDgcCompress<Format>(g, t, slots));
    Report(Sprintf("%s d=%lld: dgc_compress vs naive", name, static_cast<long long>(size)).c_str(), v.ok(), v.first);
    v = CompareEncoded(NaiveTopk<Format>(g, slots), RefTopkCompress<Format>(g, slots));
    Report(Sprintf("%s d=%lld: topk_compress vs naive", name, static_cast<long long>(size)).c_str(), v.ok(), v.first);
  }
}

// v rounded toward zero into the format (as raw bits): within one ulp of v.
template <class Format>
typename Format::Bits TowardZero(float v) {
  using Bits = typename Format::Bits;
  const Bits sign = std::signbit(v) ? static_cast<Bits>(Bits{1} << (8 * sizeof(Bits) - 1)) : Bits{0};
  if (std::isnan(v)) return static_cast<Bits>(Format::kInfKey | 1);
  const float magnitude = std::fabs(v);
  Bits key = ThresholdKey<Format>(magnitude);  // the smallest value >= magnitude
  if (key > 0 && Format::KeyToFloat(key) > magnitude) --key;
  return static_cast<Bits>(sign | key);
}

// The comparisons must catch what a broken kernel would produce.
template <class Format>
void CheckCheckers(const char* name, Rng* rng) {
  const std::vector<typename Format::Bits> g = MakeGradient<Format>(100003, rng->Next());
  const Encoded<Format> good = RefDragonnCompress<Format>(g, 0.5f, 7, 2000);
  Encoded<Format> bad = good;
  bad.values[1234] ^= 1;  // one value bit
  Report(Sprintf("%s: a flipped value bit is caught", name).c_str(), !CompareEncoded(good, bad).ok(), "");
  bad = good;
  std::swap(bad.indices[10], bad.indices[11]);
  Report(Sprintf("%s: two swapped indices are caught", name).c_str(), CompareEncoded(good, bad).mismatches == 2, "");
  bad = good;
  bad.indices.back() = static_cast<int32_t>(0xABABABAB);  // the poison the GPU outputs start from
  bad.values.back() = static_cast<typename Format::Bits>(0xABABABAB);
  Report(Sprintf("%s: a never-written (poisoned) slot is caught", name).c_str(), !CompareEncoded(good, bad).ok(), "");
  Report(Sprintf("%s: identical outputs pass", name).c_str(), CompareEncoded(good, good).ok(), "");

  // Decode: 4 payloads of the dragonn output; the bits of the float sums as the GPU would return them.
  std::vector<typename Format::Bits> values;
  std::vector<int32_t> indices;
  for (int worker = 0; worker < 4; ++worker) {
    const Encoded<Format> e = RefDragonnCompress<Format>(g, 0.5f, worker, 2000);
    values.insert(values.end(), e.values.begin(), e.values.end());
    indices.insert(indices.end(), e.indices.begin(), e.indices.end());
  }
  DecodeReference expected;
  const bool valid = RefSparseBatchedDecode<Format>(values, indices, g.size(), &expected) < 0;
  std::vector<typename Format::Bits> got(g.size());
  for (size_t i = 0; i < got.size(); ++i) got[i] = TowardZero<Format>(expected.dense[i]);
  const Verdict rounded = CompareDecode<Format>(expected, got);
  Report(Sprintf("%s: decode of 4 payloads, rounded to the format, passes", name).c_str(), valid && rounded.ok(),
         rounded.first);
  size_t target = 0;  // an element with a finite, nonzero sum
  while (target + 1 < got.size() &&
         !(expected.count[target] > 0 && std::isfinite(expected.dense[target]) && expected.dense[target] != 0.0f)) {
    ++target;
  }
  got[target] = static_cast<typename Format::Bits>(got[target] + 64);  // 64 ulps off
  Report(Sprintf("%s: a decode element 64 ulps off is caught", name).c_str(),
         !CompareDecode<Format>(expected, got).ok(), "");
  std::vector<int32_t> out_of_range = indices;
  out_of_range[777] = static_cast<int32_t>(g.size());
  Report(Sprintf("%s: decode reference reports index == size at pair 777", name).c_str(),
         RefSparseBatchedDecode<Format>(values, out_of_range, g.size(), &expected) == 777, "");
}

}  // namespace

int RunSelfCheck(uint64_t seed) {
  failures = 0;
  Rng rng{seed};
  CheckKeys<Float16Format>("float16", &rng);
  CheckKeys<BFloat16Format>("bfloat16", &rng);
  CheckReferences<Float32Format>("float32", &rng);
  CheckReferences<Float16Format>("float16", &rng);
  CheckReferences<BFloat16Format>("bfloat16", &rng);
  CheckCheckers<Float32Format>("float32", &rng);
  CheckCheckers<Float16Format>("float16", &rng);
  CheckCheckers<BFloat16Format>("bfloat16", &rng);
  return failures;
}

#define TFCOMP_INSTANTIATE(Format)                                                                                \
  template float RefEstimateThreshold<Format>(const std::vector<Format::Bits>&, int64_t, float, int64_t);         \
  template Encoded<Format> RefDragonnCompress<Format>(const std::vector<Format::Bits>&, float, int64_t, int64_t); \
  template Encoded<Format> RefDgcCompress<Format>(const std::vector<Format::Bits>&, float, int64_t);              \
  template Encoded<Format> RefTopkCompress<Format>(const std::vector<Format::Bits>&, int64_t);                    \
  template int64_t RefSparseBatchedDecode<Format>(const std::vector<Format::Bits>&, const std::vector<int32_t>&,  \
                                                  int64_t, DecodeReference*);                                     \
  template Verdict CompareEncoded<Format>(const Encoded<Format>&, const Encoded<Format>&);                        \
  template Verdict CompareDecode<Format>(const DecodeReference&, const std::vector<Format::Bits>&);               \
  template std::vector<Format::Bits> MakeGradient<Format>(int64_t, uint64_t);
TFCOMP_INSTANTIATE(Float32Format)
TFCOMP_INSTANTIATE(Float16Format)
TFCOMP_INSTANTIATE(BFloat16Format)
#undef TFCOMP_INSTANTIATE

}  // namespace harness
}  // namespace tfcomp
