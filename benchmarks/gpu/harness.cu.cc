// Standalone GPU harness of the tfcomp CUDA kernels (ops/cc/cuda/), no TensorFlow.
//
//   gpu_harness --self-check   host only, no GPU needed: the CPU reference path against naive
//                              definitions, the harness's comparisons against corrupted outputs, the
//                              launchers' argument checks, and (without a GPU) that every launcher
//                              returns the CUDA error instead of aborting
//   gpu_harness --check [--max-log2 27]
//       every kernel, float32/float16/bfloat16, against the CPU reference (reference.cc, built on
//       ops/cc/lib) on fresh random inputs, outputs poisoned (0xAB bytes) before each run, sizes that
//       are not multiples of the block or tile size, and each dtype at d = 2^max-log2
//   gpu_harness --bench [--min-log2 20] [--max-log2 27] [--runs 21] [--ratio 0.001]
//       float32 timings with CUDA events after 3 warm-up runs, median of --runs; prints one line
//       "RESULT<TAB>op<TAB>d<TAB>median_ms" per measurement (benchmarks/gpu/report.py reads them)
//   gpu_harness --loads [--log2 27] [--runs 21] [--rounds 7]
//       the read floor and DRAGONN's hashing pass with read-only-cache and with streaming loads,
//       interleaved rounds (where the pass loses to the floor)
//
// Exit status: 0 when every check passed, 1 when one failed, 2 on a CUDA error or bad usage.
#include <cuda_runtime.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "benchmarks/gpu/reference.h"
#include "ops/cc/cuda/device_util.cuh"
#include "ops/cc/cuda/tfcomp_cuda.h"
#include "ops/cc/lib/hashing.h"
#include "ops/cc/lib/partition.h"
#include "ops/cc/lib/quantize.h"
#include "ops/cc/lib/sum_pairs.h"
#include "ops/cc/lib/words.h"

namespace tfcomp {
namespace harness {
namespace {

#define HARNESS_CUDA(expr)                                                                                           \
  do {                                                                                                               \
    const cudaError_t harness_error_ = (expr);                                                                       \
    if (harness_error_ != cudaSuccess) {                                                                             \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(harness_error_)); \
      std::exit(2);                                                                                                  \
    }                                                                                                                \
  } while (0)

// A device array of n elements of T (at least one element is allocated).
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(int64_t n) : n_(n) { HARNESS_CUDA(cudaMalloc(&data_, std::max<int64_t>(n, 1) * sizeof(T))); }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(static_cast<int64_t>(host.size())) {
    HARNESS_CUDA(cudaMemcpy(data_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~DeviceArray() { cudaFree(data_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const { return data_; }
  void Upload(const std::vector<T>& host) {
    HARNESS_CUDA(
        cudaMemcpy(data_, host.data(), std::min<int64_t>(n_, host.size()) * sizeof(T), cudaMemcpyHostToDevice));
  }
  void Poison() { HARNESS_CUDA(cudaMemset(data_, 0xAB, n_ * sizeof(T))); }
  std::vector<T> Download() const {
    std::vector<T> host(n_);
    HARNESS_CUDA(cudaDeviceSynchronize());
    HARNESS_CUDA(cudaMemcpy(host.data(), data_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  T* data_ = nullptr;
  int64_t n_;
};

// Scratch for one launcher, sized by its query launch(nullptr, bytes).
template <class Launch>
DeviceArray<char> ScratchFor(const Launch& launch, size_t* bytes) {
  *bytes = 0;
  HARNESS_CUDA(launch(nullptr, bytes));
  return DeviceArray<char>(static_cast<int64_t>(*bytes));
}

template <class Launch>
void RunWithScratch(const Launch& launch) {
  size_t bytes;
  DeviceArray<char> scratch = ScratchFor(launch, &bytes);
  HARNESS_CUDA(launch(scratch.get(), &bytes));
  HARNESS_CUDA(cudaDeviceSynchronize());
}

int failures = 0;

void Report(const std::string& check, const Verdict& verdict) {
  std::printf("%-64s %s", check.c_str(), verdict.ok() ? "ok" : "FAILED");
  if (!verdict.ok())
    std::printf("  %lld mismatches, first %s", static_cast<long long>(verdict.mismatches), verdict.first.c_str());
  std::printf("\n");
  std::fflush(stdout);
  if (!verdict.ok()) ++failures;
}

Verdict Expect(bool condition, const std::string& what) {
  Verdict verdict;
  if (!condition) verdict.mismatches = 1, verdict.first = what;
  return verdict;
}

// The random (value, index) pairs of `payloads` payloads of m pairs each, indices in [-1, size).
template <class Format>
void MakePairs(int64_t payloads, int64_t m, int64_t size, uint64_t seed, std::vector<typename Format::Bits>* values,
               std::vector<int32_t>* indices) {
  *values = MakeGradient<Format>(payloads * m, seed);
  indices->resize(payloads * m);
  for (int64_t p = 0; p < payloads * m; ++p) {
    const uint64_t r = Mix64(seed ^ Mix64(p));
    (*indices)[p] = r % 97 == 0 ? -1 : static_cast<int32_t>(ReduceToRange(static_cast<uint32_t>(r >> 32), size));
  }
}

// ---------------------------------------------------------------------------------------------
// --check

// sparse_batched_decode of `payloads` payloads of `budget` random pairs (some -1), then with two bad
// indices: against the reference, bit for bit for float32, twice (deterministic).
template <class Format>
void CheckDecode(const std::string& at, int64_t size, int payloads, int64_t budget, uint64_t seed) {
  using Bits = typename Format::Bits;
  cudaStream_t stream = 0;
  std::vector<Bits> pair_values;
  std::vector<int32_t> pair_indices;
  MakePairs<Format>(payloads, budget, size, seed, &pair_values, &pair_indices);
  const DeviceArray<Bits> d_pair_values(pair_values);
  DeviceArray<int32_t> d_pair_indices(pair_indices);
  DeviceArray<Bits> d_dense(size);
  DeviceArray<int64_t> d_first_bad(1);
  d_dense.Poison();
  d_first_bad.Poison();
  const int64_t pairs = pair_values.size();
  const std::string check = at + "sparse_batched_decode of " + std::to_string(payloads) + " payloads";
  auto decode = [&]() {
    d_dense.Poison();
    d_first_bad.Poison();
    RunWithScratch([&](void* scratch, size_t* bytes) {
      return cuda::SparseBatchedDecode<Format>(d_pair_values.get(), d_pair_indices.get(), pairs, size, d_dense.get(),
                                               d_first_bad.get(), scratch, bytes, stream);
    });
    return d_dense.Download();
  };
  const std::vector<Bits> dense = decode();
  DecodeReference want_dense;
  RefSparseBatchedDecode<Format>(pair_values, pair_indices, size, &want_dense);
  Report(check, CompareDecode<Format>(want_dense, dense));
  if (sizeof(Bits) == 4) {  // the reference adds float32 in pair order, as the GPU must
    Verdict exact;
    for (int64_t i = 0; i < size; ++i) {
      const float want = want_dense.dense[i];
      const bool same = std::isnan(want) ? std::isnan(ValueOf<Format>(dense[i])) : dense[i] == FloatToBits(want);
      if (!same && exact.mismatches++ == 0) {
        exact.first = "dense[" + std::to_string(i) + "]: expected " + std::to_string(want) + ", got bits " +
                      std::to_string(dense[i]);
      }
    }
    Report(check + " equals the CPU's sum bit for bit", exact);
  }
  Report(check + " is deterministic", Expect(decode() == dense, "a second decode differs"));
  Report(check + " reports no bad index", Expect(d_first_bad.Download()[0] >= pairs, "a bad index"));
  pair_indices[pairs / 2] = static_cast<int32_t>(std::min<int64_t>(size, INT32_MAX));
  pair_indices[pairs - 1] = -2;
  d_pair_indices.Upload(pair_indices);
  decode();
  const int64_t first_bad = d_first_bad.Download()[0];
  Report(check + " finds the first bad index",
         Expect(first_bad == pairs / 2 &&
                    RefSparseBatchedDecode<Format>(pair_values, pair_indices, size, &want_dense) == pairs / 2,
                "expected pair " + std::to_string(pairs / 2) + ", got " + std::to_string(first_bad)));
}

// estimate_threshold where few or no samples are finite: every element NaN or +-Inf but `finite`
// of them, which take random values, with k far above `finite`.
template <class Format>
void CheckThresholdFewFinite(const char* dtype, int64_t size, int64_t finite, uint64_t seed) {
  using Bits = typename Format::Bits;
  std::vector<Bits> grad = MakeGradient<Format>(size, seed);
  for (int64_t i = finite; i < size; ++i) {
    const int sign_shift = 8 * sizeof(Bits) - 1;
    grad[i] = static_cast<Bits>(Format::kInfKey | (i % 3 == 0 ? 1 : 0) | (i % 2 ? Bits{1} << sign_shift : 0));
  }
  const DeviceArray<Bits> d_grad(grad);
  const int64_t hash_seed = static_cast<int64_t>(Mix64(seed));
  const DeviceArray<int64_t> d_seed(std::vector<int64_t>{hash_seed});
  DeviceArray<float> d_threshold(1);
  d_threshold.Poison();
  const float ratio = 0.5f;
  RunWithScratch([&](void* scratch, size_t* bytes) {
    return cuda::EstimateThreshold<Format>(d_grad.get(), size, size, SampleRank(ratio, size), d_seed.get(),
                                           d_threshold.get(), scratch, bytes, 0);
  });
  const float got = d_threshold.Download()[0];
  const float want = RefEstimateThreshold<Format>(grad, size, ratio, hash_seed);
  Report(std::string(dtype) + " d=" + std::to_string(size) + ", " + std::to_string(finite) +
             " finite: estimate_threshold",
         Expect(FloatToBits(got) == FloatToBits(want),
                "expected " + std::to_string(want) + ", got " + std::to_string(got)));
}

template <class Format>
void CheckSize(const char* dtype, int64_t size, uint64_t seed) {
  using Bits = typename Format::Bits;
  const std::string at = std::string(dtype) + " d=" + std::to_string(size) + ": ";
  const std::vector<Bits> grad = MakeGradient<Format>(size, seed);
  const DeviceArray<Bits> d_grad(grad);
  const int64_t hash_seed = static_cast<int64_t>(Mix64(seed));
  const DeviceArray<int64_t> d_seed(std::vector<int64_t>{hash_seed});
  const float ratio = size <= 65537 ? 0.01f : 0.001f;
  const int64_t budget = std::max<int64_t>(1, std::llround(ratio * size));
  cudaStream_t stream = 0;

  // estimate_threshold
  const int64_t num_samples = 65536, n = std::min<int64_t>(num_samples, size);
  DeviceArray<float> d_threshold(1);
  d_threshold.Poison();
  RunWithScratch([&](void* scratch, size_t* bytes) {
    return cuda::EstimateThreshold<Format>(d_grad.get(), size, n, SampleRank(ratio, n), d_seed.get(), d_threshold.get(),
                                           scratch, bytes, stream);
  });
  const float threshold = d_threshold.Download()[0];
  const float want_threshold = RefEstimateThreshold<Format>(grad, num_samples, ratio, hash_seed);
  Report(at + "estimate_threshold",
         Expect(FloatToBits(threshold) == FloatToBits(want_threshold),
                "expected " + std::to_string(want_threshold) + ", got " + std::to_string(threshold)));

  // The encodes use the GPU's threshold, on the device.
  DeviceArray<Bits> d_values(budget);
  DeviceArray<int32_t> d_indices(budget);
  auto encoded = [&]() {
    Encoded<Format> got{d_values.Download(), d_indices.Download()};
    d_values.Poison();
    d_indices.Poison();
    return got;
  };
  d_values.Poison();
  d_indices.Poison();
  // One scratch for every dragonn_compress below, kept as the op keeps it: the first call finds it
  // poisoned and zeroes its slots, each later one finds them as the call before left them (zero).
  size_t dragonn_bytes = 0;
  HARNESS_CUDA(cuda::DragonnCompress<Format>(d_grad.get(), size, d_threshold.get(), d_seed.get(), budget, nullptr,
                                             nullptr, nullptr, &dragonn_bytes, stream));
  DeviceArray<uint64_t> dragonn_scratch(static_cast<int64_t>((dragonn_bytes + 7) / 8));
  dragonn_scratch.Poison();
  bool slots_zero = false;
  auto dragonn = [&](const std::string& check, int64_t num_slots, const Bits* addend, Bits* sum) {
    size_t bytes = dragonn_bytes;
    HARNESS_CUDA(cuda::DragonnCompress<Format>(d_grad.get(), size, d_threshold.get(), d_seed.get(), num_slots,
                                               d_values.get(), d_indices.get(), dragonn_scratch.get(), &bytes, stream,
                                               addend, sum, slots_zero));
    slots_zero = true;
    const std::vector<uint64_t> slots = dragonn_scratch.Download();
    Verdict left;
    for (int64_t s = 0; s < budget; ++s) {
      if (slots[s] != 0 && left.mismatches++ == 0) left.first = "slot " + std::to_string(s) + " left nonzero";
    }
    Report(at + check + " leaves its slots zero", left);
  };
  dragonn("dragonn_compress", budget, nullptr, nullptr);
  Report(at + "dragonn_compress",
         CompareEncoded(RefDragonnCompress<Format>(grad, threshold, hash_seed, budget), encoded()));
  // About 16 selected elements per slot: nearly every slot is decided by a collision.
  const int64_t few_slots = std::max<int64_t>(1, budget / 16);
  dragonn("dragonn_compress, 16x collisions,", few_slots, nullptr, nullptr);
  {
    Encoded<Format> got = encoded();
    got.values.resize(few_slots);
    got.indices.resize(few_slots);
    Report(at + "dragonn_compress, 16x collisions",
           CompareEncoded(RefDragonnCompress<Format>(grad, threshold, hash_seed, few_slots), got));
  }
  if constexpr (sizeof(Bits) == sizeof(uint32_t)) {
    // Error feedback's fused accumulation: threshold and DRAGONN of grad + residual, the sum written.
    const std::vector<Bits> residual = MakeGradient<Format>(size, seed ^ 0x5EEDull);
    const DeviceArray<Bits> d_residual(residual);
    DeviceArray<Bits> d_sum(size);
    d_sum.Poison();
    d_threshold.Poison();
    RunWithScratch([&](void* scratch, size_t* bytes) {
      return cuda::EstimateThreshold<Format>(d_grad.get(), size, n, SampleRank(ratio, n), d_seed.get(),
                                             d_threshold.get(), scratch, bytes, stream, d_residual.get());
    });
    dragonn("dragonn_compress with an addend", budget, d_residual.get(), d_sum.get());
    const std::vector<Bits> sum = d_sum.Download();
    Verdict sums;
    for (int64_t i = 0; i < size; ++i) {
      const Bits want = SumBits(grad[i], residual[i]);
      const bool nan = std::isnan(BitsToFloat(want));
      if ((nan ? !std::isnan(BitsToFloat(sum[i])) : sum[i] != want) && sums.mismatches++ == 0) {
        sums.first = "sum[" + std::to_string(i) + "]: expected bits " + std::to_string(want) + ", got " +
                     std::to_string(sum[i]);
      }
    }
    Report(at + "dragonn_compress with an addend writes grad + addend", sums);
    // The references run on the GPU's sum (NaN payloads may differ from the host's).
    const float sum_threshold = d_threshold.Download()[0];
    const float want_sum_threshold = RefEstimateThreshold<Format>(sum, num_samples, ratio, hash_seed);
    Report(at + "estimate_threshold with an addend",
           Expect(FloatToBits(sum_threshold) == FloatToBits(want_sum_threshold),
                  "expected " + std::to_string(want_sum_threshold) + ", got " + std::to_string(sum_threshold)));
    Report(at + "dragonn_compress with an addend",
           CompareEncoded(RefDragonnCompress<Format>(sum, sum_threshold, hash_seed, budget), encoded()));
    d_threshold.Upload(std::vector<float>{threshold});
  }
  RunWithScratch([&](void* scratch, size_t* bytes) {
    return cuda::DgcCompress<Format>(d_grad.get(), size, d_threshold.get(), budget, d_values.get(), d_indices.get(),
                                     scratch, bytes, stream);
  });
  Report(at + "dgc_compress", CompareEncoded(RefDgcCompress<Format>(grad, threshold, budget), encoded()));
  RunWithScratch([&](void* scratch, size_t* bytes) {
    return cuda::TopkCompress<Format>(d_grad.get(), size, budget, d_values.get(), d_indices.get(), scratch, bytes,
                                      stream);
  });
  Report(at + "topk_compress", CompareEncoded(RefTopkCompress<Format>(grad, budget), encoded()));

  CheckDecode<Format>(at, size, 4, budget, seed + 1);
  CheckDecode<Format>(at, size, 64, budget, seed + 2);  // hundreds of pairs per tile, many repeated
}

// zero_at on a float32 tensor of `size` elements at `offset` in a bucket: random indices, some
// before, inside and after the tensor's range, repeated, and -1.
void CheckZeroAt(int64_t size, uint64_t seed) {
  const std::string at = "float32 d=" + std::to_string(size) + ": zero_at";
  const std::vector<uint32_t> bits = MakeGradient<Float32Format>(size, seed);
  std::vector<float> data(size);
  std::memcpy(data.data(), bits.data(), size * sizeof(float));
  const int64_t offset = size / 3, n = std::max<int64_t>(1, size / 50);
  std::vector<int32_t> indices(n);
  for (int64_t p = 0; p < n; ++p) {
    const uint64_t r = Mix64(seed ^ Mix64(p));
    indices[p] = r % 31 == 0 ? -1 : static_cast<int32_t>(ReduceToRange(static_cast<uint32_t>(r >> 32), 2 * size));
  }
  std::vector<float> want = data;
  for (int32_t i : indices) {
    if (i >= offset && i < offset + size) want[i - offset] = 0.0f;
  }
  DeviceArray<float> d_data(data);
  const DeviceArray<int32_t> d_indices(indices);
  HARNESS_CUDA(cuda::ZeroAt(d_data.get(), size, d_indices.get(), n, offset, 0));
  const std::vector<float> got = d_data.Download();
  Verdict verdict;
  for (int64_t i = 0; i < size; ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && verdict.mismatches++ == 0) {
      verdict.first = "element " + std::to_string(i) + ": expected " + std::to_string(want[i]) + ", got " +
                      std::to_string(got[i]);
    }
  }
  Report(at, verdict);
}

// The float32 tensor of MakeGradient's bits (NaN, Inf, zeros and subnormals among its values).
std::vector<float> MakeFloats(int64_t size, uint64_t seed) {
  const std::vector<uint32_t> bits = MakeGradient<Float32Format>(size, seed);
  std::vector<float> values(size);
  std::memcpy(values.data(), bits.data(), size * sizeof(float));
  return values;
}

// Bit-for-bit comparison of a float32 output with the host's, where any NaN matches any NaN: the
// GPU's float arithmetic returns its one NaN (0x7FFFFFFF) where x86's SSE keeps an operand's
// payload and sign.
Verdict CompareFloats(const std::vector<float>& want, const std::vector<float>& got) {
  Verdict verdict;
  for (size_t i = 0; i < want.size(); ++i) {
    const bool same = std::isnan(want[i]) ? std::isnan(got[i]) : std::memcmp(&got[i], &want[i], sizeof(float)) == 0;
    if (!same && verdict.mismatches++ == 0) {
      verdict.first = "element " + std::to_string(i) + ": expected " + std::to_string(want[i]) + ", got " +
                      std::to_string(got[i]);
    }
  }
  return verdict;
}

// momentum_accumulate and adam_accumulate of `size` elements, with and without a residual, against
// the same element-wise functions (ops/cc/lib/accumulate.h) run on the host: bit for bit, NaN
// payloads aside (neither side flushes denormals here).
void CheckAccumulate(int64_t size, uint64_t seed) {
  const std::string at = "float32 d=" + std::to_string(size) + ": ";
  const std::vector<float> grad = MakeFloats(size, seed), first = MakeFloats(size, seed + 1);
  const std::vector<float> residual = MakeFloats(size, seed + 2);
  std::vector<float> second = MakeFloats(size, seed + 3);
  for (float& x : second) x = std::fabs(x);
  const DeviceArray<float> d_grad(grad), d_first(first), d_second(second), d_residual(residual);
  DeviceArray<float> d_new_first(size), d_new_second(size), d_accumulated(size);
  const AdamCoefficients adam{0.9f, 0.1f, 0.999f, 0.001f, 1e-7f, 0.271f, 0.0394f};
  const DeviceArray<float> d_corrections(std::vector<float>{adam.m_correction, adam.v_correction});
  for (const bool with_residual : {false, true}) {
    const float* r = with_residual ? residual.data() : nullptr;
    const float* d_r = with_residual ? d_residual.get() : nullptr;
    const std::string which = with_residual ? " with a residual" : "";
    std::vector<float> want_first(size), want_second(size), want_accumulated(size);
    for (int64_t i = 0; i < size; ++i) {
      MomentumAccumulateAt(i, grad.data(), first.data(), r, 0.9f, want_first.data(), want_accumulated.data());
    }
    HARNESS_CUDA(cuda::MomentumAccumulate(d_grad.get(), d_first.get(), d_r, size, 0.9f, d_new_first.get(),
                                          d_accumulated.get(), 0));
    Report(at + "momentum_accumulate" + which + ", momentum", CompareFloats(want_first, d_new_first.Download()));
    Report(at + "momentum_accumulate" + which + ", accumulated",
           CompareFloats(want_accumulated, d_accumulated.Download()));
    for (int64_t i = 0; i < size; ++i) {
      AdamAccumulateAt(i, grad.data(), first.data(), second.data(), r, adam, want_first.data(), want_second.data(),
                       want_accumulated.data());
    }
    HARNESS_CUDA(cuda::AdamAccumulate(d_grad.get(), d_first.get(), d_second.get(), d_r, size, adam,
                                      d_corrections.get(), d_corrections.get() + 1, d_new_first.get(),
                                      d_new_second.get(), d_accumulated.get(), 0));
    Report(at + "adam_accumulate" + which + ", m", CompareFloats(want_first, d_new_first.Download()));
    Report(at + "adam_accumulate" + which + ", v", CompareFloats(want_second, d_new_second.Download()));
    Report(at + "adam_accumulate" + which + ", accumulated", CompareFloats(want_accumulated, d_accumulated.Download()));
  }
}

// hash_partition of n pairs (a payload of a tensor of 4 n elements, a third of the slots empty,
// NaN and Inf among the values) among num_parts owners: the two launches around the host's
// exclusive sum, against the CPU's counting sort (ops/cc/lib/partition.h), rows bit for bit.
void CheckHashPartition(int64_t n, int32_t num_parts, uint64_t seed) {
  const std::string at = "hash_partition n=" + std::to_string(n) + " parts=" + std::to_string(num_parts);
  std::vector<float> values(n);
  std::vector<int32_t> indices(n);
  for (int64_t p = 0; p < n; ++p) {
    const uint64_t r = Mix64(seed ^ Mix64(p));
    indices[p] = r % 3 == 0 ? -1 : static_cast<int32_t>(ReduceToRange(static_cast<uint32_t>(r >> 32), 4 * n));
    values[p] = r % 101 == 0 ? NAN : r % 103 == 0 ? INFINITY : static_cast<float>(static_cast<int32_t>(r)) * 1e-9f;
  }
  std::vector<int32_t> counts(num_parts);
  if (CountPairsPerOwner(indices.data(), n, num_parts, counts.data()) >= 0) std::abort();
  int64_t total = 0;
  for (int32_t c : counts) total += c;
  std::vector<int32_t> want(2 * total);
  WriteRowsByOwner(values.data(), indices.data(), n, num_parts, counts.data(), want.data());

  const int64_t chunks = cuda::PartitionChunks(n);
  const DeviceArray<float> d_values(values);
  const DeviceArray<int32_t> d_indices(indices);
  DeviceArray<int32_t> d_counts(chunks * num_parts);
  DeviceArray<int64_t> d_bad(chunks);
  HARNESS_CUDA(cuda::HashPartitionCount(d_indices.get(), n, num_parts, d_counts.get(), d_bad.get(), 0));
  const std::vector<int32_t> chunk_counts = d_counts.Download();
  std::vector<int64_t> cursors(chunks * num_parts);
  int64_t next = 0;
  for (int32_t p = 0; p < num_parts; ++p) {
    for (int64_t c = 0; c < chunks; ++c) {
      cursors[c * num_parts + p] = next;
      next += chunk_counts[c * num_parts + p];
    }
  }
  DeviceArray<int64_t> d_cursors(cursors);
  DeviceArray<int32_t> d_rows(2 * total);
  HARNESS_CUDA(cuda::HashPartitionWrite(d_values.get(), d_indices.get(), n, num_parts, d_cursors.get(), d_rows.get(), 0));
  std::vector<int32_t> got = d_rows.Download();
  got.resize(2 * total);
  Verdict verdict;
  if (next != total) {
    verdict.mismatches++;
    verdict.first = "counted " + std::to_string(next) + " pairs, expected " + std::to_string(total);
  }
  for (int64_t i = 0; i < 2 * total && verdict.mismatches == 0; ++i) {
    if (got[i] != want[i]) {
      verdict.mismatches++;
      verdict.first = "row word " + std::to_string(i) + ": expected " + std::to_string(want[i]) + ", got " +
                      std::to_string(got[i]);
    }
  }
  Report(at, verdict);
}

// TensorFlow's floating-point mode on its CPU threads, where the CPU kernels run, for the scope's
// life: denormal operands read as zeros, denormal results flushed (x86: MXCSR's DAZ and FTZ bits;
// elsewhere nothing changes, and the references' denormal sums may differ from the GPU's).
class ScopedFlushDenormals {
 public:
#if defined(__x86_64__) || defined(__i386__)
  ScopedFlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); }  // FTZ | DAZ
  ~ScopedFlushDenormals() { _mm_setcsr(saved_); }

 private:
  unsigned int saved_;
#else
  ScopedFlushDenormals() {}
#endif
};

// n rows (index, float32 bits) for sum_pairs: indices drawn from `range` values spread over
// [0, 2^31) by an odd multiplier (0 and 2^31 - 1 among them), so that most repeat when range << n;
// values MakeGradient's (NaN, Inf, zeros, subnormals, equal magnitudes), one in 64 replaced by a
// special value: NaNs of both signs and several payloads, signalling NaNs, +-Inf, +-0, the largest
// finite values (their sums overflow), +-1 and subnormals.
std::vector<int32_t> MakeSumPairsRows(int64_t n, int64_t range, uint64_t seed) {
  static const uint32_t kSpecial[16] = {0x7FC00000u, 0xFFC00000u, 0x7FC00123u, 0xFFD00001u, 0x7F800001u, 0xFF812345u,
                                        0x7F800000u, 0xFF800000u, 0x00000000u, 0x80000000u, 0x7F7FFFFFu, 0xFF7FFFFFu,
                                        0x3F800000u, 0xBF800000u, 0x00000001u, 0x807FFFFFu};
  const std::vector<uint32_t> values = MakeGradient<Float32Format>(n, seed);
  std::vector<int32_t> rows(2 * n);
  for (int64_t r = 0; r < n; ++r) {
    const uint64_t u = Mix64(seed ^ Mix64(r));
    const uint64_t k = ReduceToRange(static_cast<uint32_t>(u >> 32), static_cast<uint32_t>(range));
    rows[2 * r] = k == 1 ? INT32_MAX : static_cast<int32_t>((k * 0x9E3779B1ull) & 0x7FFFFFFFull);
    rows[2 * r + 1] = static_cast<int32_t>(u % 64 == 0 ? kSpecial[(u >> 6) % 16] : values[r]);
  }
  return rows;
}

// The CPU kernel's sum_pairs (ops/cc/kernels/sum_pairs_kernels.cc) on the host, from the same core
// (ops/cc/lib/sum_pairs.h) in TensorFlow's floating-point mode: the kept rows, *distinct and
// *first_negative (-1: none; then no rows).
std::vector<int32_t> HostSumPairs(const std::vector<int32_t>& rows, int64_t max_pairs, int64_t* distinct,
                                  int64_t* first_negative) {
  const ScopedFlushDenormals flush;
  const int64_t n = static_cast<int64_t>(rows.size()) / 2;
  *distinct = 0;
  *first_negative = FirstNegativeRowIndex(rows.data(), n);
  if (*first_negative >= 0) return {};
  std::vector<uint64_t> keyed(n), scratch(n);
  std::vector<int32_t> sums(2 * n);
  SortRowsByIndex(rows.data(), n, keyed.data(), scratch.data());
  *distinct = SumRowsPerIndex(rows.data(), n, keyed.data(), sums.data());
  const int64_t kept = max_pairs < 0 ? *distinct : std::min(*distinct, max_pairs);
  std::vector<int32_t> out(2 * kept);
  KeepSmallestKeys(sums.data(), *distinct, kept, out.data());
  return out;
}

// Word-by-word comparison of sum_pairs rows.
Verdict CompareRows(const std::vector<int32_t>& want, const std::vector<int32_t>& got) {
  Verdict verdict;
  if (got.size() != want.size()) {
    verdict.mismatches = 1;
    verdict.first = std::to_string(got.size() / 2) + " rows, expected " + std::to_string(want.size() / 2);
    return verdict;
  }
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i] != want[i] && verdict.mismatches++ == 0) {
      char what[160];
      std::snprintf(what, sizeof(what), "row %zu %s: expected 0x%08X, got 0x%08X", i / 2, i % 2 ? "sum" : "index",
                    static_cast<uint32_t>(want[i]), static_cast<uint32_t>(got[i]));
      verdict.first = what;
    }
  }
  return verdict;
}

// sum_pairs of n random rows (MakeSumPairsRows) keeping at most max_pairs sums (-1: all): the two
// launches around the host, against the CPU core on the host in TensorFlow's floating-point mode
// (HostSumPairs), bit for bit, NaN bits included; with max_pairs -1 also with two negative indices,
// the first of which must be found.
void CheckSumPairs(int64_t n, int64_t range, int64_t max_pairs, uint64_t seed) {
  const std::string at = "sum_pairs n=" + std::to_string(n) + " range=" + std::to_string(range) +
                         " max_pairs=" + std::to_string(max_pairs);
  std::vector<int32_t> rows = MakeSumPairsRows(n, range, seed);
  int64_t want_distinct, want_negative;
  const std::vector<int32_t> want = HostSumPairs(rows, max_pairs, &want_distinct, &want_negative);
  DeviceArray<int32_t> d_rows(rows);
  DeviceArray<int32_t> d_sums(2 * n);
  DeviceArray<int64_t> d_counts(2);  // first negative row, distinct indices
  auto per_index = [&]() {
    d_sums.Poison();
    d_counts.Poison();
    RunWithScratch([&](void* scratch, size_t* bytes) {
      return cuda::SumPairsPerIndex(d_rows.get(), n, d_sums.get(), d_counts.get(), d_counts.get() + 1, scratch, bytes,
                                    0);
    });
    return d_counts.Download();
  };
  const std::vector<int64_t> counts = per_index();
  Verdict verdict;
  if (counts[0] < n) {
    verdict.mismatches = 1;
    verdict.first = "a negative index reported at row " + std::to_string(counts[0]);
  } else if (counts[1] != want_distinct) {
    verdict.mismatches = 1;
    verdict.first = std::to_string(counts[1]) + " distinct indices, expected " + std::to_string(want_distinct);
  } else {
    DeviceArray<int32_t> d_kept(static_cast<int64_t>(want.size()));
    d_kept.Poison();
    RunWithScratch([&](void* scratch, size_t* bytes) {
      return cuda::SumPairsKeep(d_sums.get(), counts[1], max_pairs, d_kept.get(), scratch, bytes, 0);
    });
    verdict = CompareRows(want, d_kept.Download());
  }
  Report(at, verdict);
  if (max_pairs != -1 || n < 2) return;
  rows[2 * (n / 2)] = -7;
  rows[2 * (n - 1)] = INT32_MIN;
  d_rows.Upload(rows);
  const int64_t first = per_index()[0];
  HostSumPairs(rows, max_pairs, &want_distinct, &want_negative);
  Report(at + " finds the first negative index",
         Expect(first == n / 2 && want_negative == n / 2,
                "expected row " + std::to_string(n / 2) + ", got " + std::to_string(first)));
}

// int_quantize and int_dequantize on a float32 tensor of `size` elements (NaN, Inf, denormals
// included) at each width, K = 3 workers' levels, against the host running the same code
// (ops/cc/lib/quantize.h).
void CheckIntQuantize(int64_t size, uint64_t seed) {
  const std::vector<uint32_t> bits_of = MakeGradient<Float32Format>(size, seed);
  std::vector<float> grad(size);
  std::memcpy(grad.data(), bits_of.data(), size * sizeof(float));
  float scale = 0.0f;
  for (float g : grad) {
    if (std::isfinite(g)) scale = std::max(scale, std::fabs(g));
  }
  scale *= 0.75f;  // some elements clamp
  const int64_t seed_value = static_cast<int64_t>(Mix64(seed));
  const DeviceArray<float> d_grad(grad);
  const DeviceArray<float> d_scale(std::vector<float>{scale});
  const DeviceArray<int64_t> d_seed(std::vector<int64_t>{seed_value});
  for (int bits : {4, 8, 16}) {
    const std::string at = "float32 d=" + std::to_string(size) + ": int_quantize bits=" + std::to_string(bits);
    const int32_t levels = ((1 << (bits - 1)) - 1) / 3;
    const int64_t fields = 32 / bits, num_lanes = (size + fields - 1) / fields;
    DeviceArray<int32_t> d_lanes(num_lanes);
    d_lanes.Poison();
    HARNESS_CUDA(cuda::IntQuantize(d_grad.get(), size, d_scale.get(), d_seed.get(), bits, levels, d_lanes.get(), 0));
    const std::vector<int32_t> lanes = d_lanes.Download();
    const float per_level = static_cast<float>(levels) / scale;
    const uint64_t key = Mix64(static_cast<uint64_t>(seed_value));
    Verdict packed;
    for (int64_t lane = 0; lane < num_lanes; ++lane) {
      const int32_t want = PackedLane(grad.data(), size, per_level, true, levels, bits, key, lane);
      if (lanes[lane] != want && packed.mismatches++ == 0) {
        packed.first = "lane " + std::to_string(lane) + ": expected " + std::to_string(want) + ", got " +
                       std::to_string(lanes[lane]);
      }
    }
    Report(at, packed);
    const float step = scale / static_cast<float>(levels);
    const DeviceArray<float> d_step(std::vector<float>{step});
    DeviceArray<float> d_dense(size);
    d_dense.Poison();
    HARNESS_CUDA(cuda::IntDequantize(d_lanes.get(), size, d_step.get(), bits, d_dense.get(), 0));
    const std::vector<float> dense = d_dense.Download();
    std::vector<float> want(fields);
    Verdict unpacked;
    for (int64_t lane = 0; lane < num_lanes; ++lane) {
      const int count = static_cast<int>(std::min(fields, size - lane * fields));
      UnpackLane(lanes[lane], bits, count, step, want.data());
      for (int j = 0; j < count; ++j) {
        const int64_t i = lane * fields + j;
        if (std::memcmp(&dense[i], &want[j], sizeof(float)) != 0 && unpacked.mismatches++ == 0) {
          unpacked.first = "element " + std::to_string(i) + ": expected " + std::to_string(want[j]) + ", got " +
                           std::to_string(dense[i]);
        }
      }
    }
    Report("float32 d=" + std::to_string(size) + ": int_dequantize bits=" + std::to_string(bits), unpacked);
  }
}

int RunCheck(int max_log2) {
  const std::vector<int64_t> sizes = {1, 255, 4097, 65537, 1048579, 16777259};
  uint64_t seed = 20261122;
  for (int64_t size : sizes) {
    if (size > (int64_t{1} << max_log2)) continue;
    CheckSize<Float32Format>("float32", size, ++seed);
    CheckSize<Float16Format>("float16", size, ++seed);
    CheckSize<BFloat16Format>("bfloat16", size, ++seed);
    CheckZeroAt(size, ++seed);
    CheckAccumulate(size, ++seed);
    CheckIntQuantize(size, ++seed);
    for (int32_t parts : {1, 2, 8, 61}) CheckHashPartition(size / 8 + 1, parts, ++seed);
  }
  for (int64_t finite : {0, 3}) {
    CheckThresholdFewFinite<Float32Format>("float32", 1000, finite, ++seed);
    CheckThresholdFewFinite<Float16Format>("float16", 1000, finite, ++seed);
    CheckThresholdFewFinite<BFloat16Format>("bfloat16", 1000, finite, ++seed);
  }
  const int64_t largest = int64_t{1} << max_log2;
  CheckSize<Float32Format>("float32", largest, ++seed);
  CheckSize<Float16Format>("float16", largest, ++seed);
  CheckSize<BFloat16Format>("bfloat16", largest, ++seed);
  CheckZeroAt(largest, ++seed);
  CheckIntQuantize(largest, ++seed);
  // sum_pairs: indices drawn from 2^31 - 1 values (nearly all distinct), from n, n / 3 and n / 50
  // (about 1, 3 and 50 rows per index) and from 7, each keeping every sum, none, one, about a third
  // of them, and max_pairs above the number of sums.
  for (int64_t n : {0, 1, 1000, 100003}) {
    if (n > (int64_t{1} << max_log2)) continue;
    for (int64_t range : {cuda::kMaxElements, n, n / 3 + 1, n / 50 + 1, int64_t{7}}) {
      range = std::max<int64_t>(1, range);
      const int64_t third = std::max<int64_t>(1, std::min(n, range) / 3);
      for (int64_t max_pairs : {int64_t{-1}, int64_t{0}, int64_t{1}, third, n + 1}) {
        CheckSumPairs(n, range, max_pairs, ++seed);
      }
    }
  }
  return failures;
}

// ---------------------------------------------------------------------------------------------
// --self-check, sum_pairs on the host: the GPU's addition (SumPairsAdd, its host build, denormals
// flushed in software) against the CPU core's in TensorFlow's floating-point mode for special
// values, NaN and denormals included, and the reference path against a naive definition (a map,
// SumPairsAdd, a sort): which NaN a float addition gives depends on the operand order the compiler
// picks, so the naive one names the order the CPU core's addition has (checked first).

void CheckSumPairsHost(uint64_t seed) {
  // A map from index to the bits of the sum in row order, then the max_pairs smallest (SelectionKey,
  // index) kept, in index order.
  auto naive = [](const std::vector<int32_t>& rows, int64_t max_pairs) {
    std::map<int32_t, uint32_t> sums;
    for (size_t r = 0; r < rows.size(); r += 2) {
      const uint32_t value = static_cast<uint32_t>(rows[r + 1]);
      const auto found = sums.find(rows[r]);
      if (found == sums.end()) {
        sums.emplace(rows[r], cuda::SumPairsAdd(0, value));
      } else {
        found->second = cuda::SumPairsAdd(found->second, value);
      }
    }
    std::vector<std::pair<uint64_t, int32_t>> ranked;
    for (const auto& [index, sum] : sums) ranked.emplace_back(SelectionKey(index, sum), index);
    std::sort(ranked.begin(), ranked.end());
    if (max_pairs >= 0 && static_cast<size_t>(max_pairs) < ranked.size()) ranked.resize(max_pairs);
    std::vector<int32_t> out;
    for (const auto& [index, sum] : sums) {
      if (std::binary_search(ranked.begin(), ranked.end(), std::make_pair(SelectionKey(index, sum), index))) {
        out.push_back(index);
        out.push_back(static_cast<int32_t>(sum));
      }
    }
    return out;
  };
  // Two rows of one index for every pair of special values (a vector: nothing to fold at compile time).
  const std::vector<uint32_t> special = {0x7FC00000u, 0xFFC00000u, 0x7FC00123u, 0xFFD00001u, 0x7F800001u,
                                         0xFF812345u, 0x7FBFFFFFu, 0x7F800000u, 0xFF800000u, 0x00000000u,
                                         0x80000000u, 0x7F7FFFFFu, 0xFF7FFFFFu, 0x3F800000u, 0xBF800000u,
                                         0x00000001u, 0x807FFFFFu, 0x00800000u, 0x00800001u, 0x80800000u,
                                         0x00FFFFFFu};
  Verdict addition;
  for (uint32_t a : special) {
    for (uint32_t b : special) {
      const int32_t rows[4] = {5, static_cast<int32_t>(a), 5, static_cast<int32_t>(b)};
      uint64_t keyed[2], scratch[2];
      int32_t sums[2];
      {
        const ScopedFlushDenormals flush;
        SortRowsByIndex(rows, 2, keyed, scratch);
        SumRowsPerIndex(rows, 2, keyed, sums);
      }
      const uint32_t want = static_cast<uint32_t>(sums[1]), got = cuda::SumPairsAdd(cuda::SumPairsAdd(0, a), b);
      if (got != want && addition.mismatches++ == 0) {
        char what[120];
        std::snprintf(what, sizeof(what), "0 + 0x%08X + 0x%08X: the core gives 0x%08X, SumPairsAdd 0x%08X", a, b,
                      want, got);
        addition.first = what;
      }
    }
  }
  Report("sum_pairs: SumPairsAdd is the CPU core's addition (NaN bits, denormals flushed)", addition);
  for (int64_t n : {0, 1, 3000}) {
    for (int64_t range : {cuda::kMaxElements, n / 3 + 1, int64_t{7}}) {
      for (int64_t max_pairs : {int64_t{-1}, int64_t{0}, int64_t{1}, n / 5 + 1, n + 1}) {
        const std::vector<int32_t> rows = MakeSumPairsRows(n, std::max<int64_t>(1, range), ++seed);
        int64_t distinct, first_negative;
        const std::vector<int32_t> got = HostSumPairs(rows, max_pairs, &distinct, &first_negative);
        Report("sum_pairs reference n=" + std::to_string(n) + " range=" + std::to_string(range) +
                   " max_pairs=" + std::to_string(max_pairs) + " against a map",
               CompareRows(naive(rows, max_pairs), got));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// --self-check, the launcher part: argument checks, and CUDA errors returned (never an abort). Without
// a GPU every launch must fail with the CUDA error; no pointer is dereferenced on the host.

std::string ErrorName(cudaError_t error) { return error == cudaSuccess ? "cudaSuccess" : cudaGetErrorName(error); }

// Reports "check: returned <error>"; want == cudaSuccess stands for any error.
void ReportError(const std::string& check, cudaError_t got, cudaError_t want) {
  Report(check + " " + ErrorName(got),
         Expect(want == cudaSuccess ? got != cudaSuccess : got == want,
                "expected " + (want == cudaSuccess ? std::string("an error") : ErrorName(want))));
}

int CheckLaunchers() {
  using F = Float32Format;
  int devices = 0;
  const bool gpu = cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
  cudaGetLastError();
  size_t bytes = size_t{1} << 40;  // "enough" scratch: only the launch itself can fail
  void* scratch = reinterpret_cast<void*>(256);
  const cudaError_t bad = cudaErrorInvalidValue;
  ReportError("launchers: dragonn_compress, num_slots = 0 ->",
              cuda::DragonnCompress<F>(nullptr, 10, nullptr, nullptr, 0, nullptr, nullptr, nullptr, &bytes, 0), bad);
  ReportError("launchers: dgc_compress, size = 2^31 ->",
              cuda::DgcCompress<F>(nullptr, int64_t{1} << 31, nullptr, 5, nullptr, nullptr, nullptr, &bytes, 0), bad);
  ReportError("launchers: topk_compress, k > size ->",
              cuda::TopkCompress<F>(nullptr, 10, 11, nullptr, nullptr, nullptr, &bytes, 0), bad);
  ReportError("launchers: estimate_threshold, n > size ->",
              cuda::EstimateThreshold<F>(nullptr, 10, 11, 1, nullptr, nullptr, nullptr, &bytes, 0), bad);
  ReportError("launchers: sparse_batched_decode, n < 0 ->",
              cuda::SparseBatchedDecode<F>(nullptr, nullptr, -1, 10, nullptr, nullptr, nullptr, &bytes, 0), bad);
  ReportError("launchers: hash_partition count, num_parts = 0 ->",
              cuda::HashPartitionCount(nullptr, 10, 0, nullptr, nullptr, 0), bad);
  ReportError("launchers: momentum_accumulate, size < 0 ->",
              cuda::MomentumAccumulate(nullptr, nullptr, nullptr, -1, 0.9f, nullptr, nullptr, 0), bad);
  ReportError("launchers: adam_accumulate, size = 2^31 ->",
              cuda::AdamAccumulate(nullptr, nullptr, nullptr, nullptr, int64_t{1} << 31, AdamCoefficients{}, nullptr,
                                   nullptr, nullptr, nullptr, nullptr, 0),
              bad);
  ReportError("launchers: hash_partition write, n < 0 ->",
              cuda::HashPartitionWrite(nullptr, nullptr, -1, 2, nullptr, nullptr, 0), bad);
  // sum_pairs: non-null stand-ins for device pointers (never dereferenced on the host).
  int32_t* const rows = reinterpret_cast<int32_t*>(256);
  int64_t* const counts = reinterpret_cast<int64_t*>(256);
  ReportError("launchers: sum_pairs per index, n < 0 ->",
              cuda::SumPairsPerIndex(rows, -1, rows, counts, counts + 1, scratch, &bytes, 0), bad);
  ReportError("launchers: sum_pairs per index, n = 2^31 ->",
              cuda::SumPairsPerIndex(rows, int64_t{1} << 31, rows, counts, counts + 1, scratch, &bytes, 0), bad);
  ReportError("launchers: sum_pairs per index, rows null ->",
              cuda::SumPairsPerIndex(nullptr, 10, rows, counts, counts + 1, scratch, &bytes, 0), bad);
  ReportError("launchers: sum_pairs per index, sums null ->",
              cuda::SumPairsPerIndex(rows, 10, nullptr, counts, counts + 1, scratch, &bytes, 0), bad);
  ReportError("launchers: sum_pairs per index, n = 0, distinct null ->",
              cuda::SumPairsPerIndex(nullptr, 0, nullptr, counts, nullptr, scratch, &bytes, 0), bad);
  ReportError("launchers: sum_pairs keep, m < 0 ->", cuda::SumPairsKeep(rows, -1, 3, rows, scratch, &bytes, 0), bad);
  ReportError("launchers: sum_pairs keep, max_pairs = -2 ->",
              cuda::SumPairsKeep(rows, 10, -2, rows, scratch, &bytes, 0), bad);
  ReportError("launchers: sum_pairs keep, kept null ->", cuda::SumPairsKeep(rows, 10, 3, nullptr, scratch, &bytes, 0),
              bad);
  ReportError("launchers: sum_pairs keep, sums null ->", cuda::SumPairsKeep(nullptr, 10, -1, rows, scratch, &bytes, 0),
              bad);
  {
    // Queries that need no CUB, so no GPU: no rows, and keeping every sum or none.
    size_t query = 1;
    const cudaError_t empty = cuda::SumPairsPerIndex(nullptr, 0, nullptr, counts, counts + 1, nullptr, &query, 0);
    Report("launchers: sum_pairs per index, n = 0 needs no scratch",
           Expect(empty == cudaSuccess && query == 0, ErrorName(empty) + ", " + std::to_string(query) + " bytes"));
    for (int64_t max_pairs : {int64_t{-1}, int64_t{0}, int64_t{10}, int64_t{11}}) {
      query = 1;
      const cudaError_t copy = cuda::SumPairsKeep(rows, 10, max_pairs, rows, nullptr, &query, 0);
      Report("launchers: sum_pairs keep of 10, max_pairs=" + std::to_string(max_pairs) + " needs no scratch",
             Expect(copy == cudaSuccess && query == 0, ErrorName(copy) + ", " + std::to_string(query) + " bytes"));
    }
    query = 1;
    const cudaError_t none = cuda::SumPairsKeep(nullptr, 0, 5, nullptr, nullptr, &query, 0);
    Report("launchers: sum_pairs keep of 0 sums needs no scratch",
           Expect(none == cudaSuccess && query == 0, ErrorName(none) + ", " + std::to_string(query) + " bytes"));
  }
  size_t small = 1;
  ReportError("launchers: dragonn_compress, scratch too small ->",
              cuda::DragonnCompress<F>(nullptr, 10, nullptr, nullptr, 100, nullptr, nullptr, scratch, &small, 0), bad);
  // Without a GPU, the scratch query of CUB's sort fails first.
  ReportError("launchers: sparse_batched_decode, scratch too small ->",
              cuda::SparseBatchedDecode<F>(nullptr, nullptr, 100, 10, nullptr, nullptr, scratch, &small, 0),
              gpu ? bad : cudaSuccess);
  ReportError("launchers: sum_pairs per index, scratch too small ->",
              cuda::SumPairsPerIndex(rows, 100, rows, counts, counts + 1, scratch, &small, 0), gpu ? bad : cudaSuccess);
  ReportError("launchers: sum_pairs keep, scratch too small ->",
              cuda::SumPairsKeep(rows, 100, 10, rows, scratch, &small, 0), gpu ? bad : cudaSuccess);
  if (gpu) {
    std::printf("(a GPU is present: the launches without a GPU are not checked)\n");
    return failures;
  }
  const int64_t d = 1000003;
  ReportError("no GPU: estimate_threshold ->",
              cuda::EstimateThreshold<F>(nullptr, d, 65536, 65, nullptr, nullptr, scratch, &bytes, 0), cudaSuccess);
  ReportError("no GPU: dragonn_compress ->",
              cuda::DragonnCompress<F>(nullptr, d, nullptr, nullptr, 1000, nullptr, nullptr, scratch, &bytes, 0),
              cudaSuccess);
  ReportError("no GPU: dgc_compress ->",
              cuda::DgcCompress<F>(nullptr, d, nullptr, 1000, nullptr, nullptr, scratch, &bytes, 0), cudaSuccess);
  ReportError("no GPU: topk_compress ->", cuda::TopkCompress<F>(nullptr, d, 1000, nullptr, nullptr, scratch, &bytes, 0),
              cudaSuccess);
  ReportError("no GPU: momentum_accumulate ->",
              cuda::MomentumAccumulate(nullptr, nullptr, nullptr, d, 0.9f, nullptr, nullptr, 0), cudaSuccess);
  ReportError("no GPU: hash_partition count ->", cuda::HashPartitionCount(nullptr, 4000, 8, nullptr, nullptr, 0),
              cudaSuccess);
  ReportError("no GPU: sparse_batched_decode ->",
              cuda::SparseBatchedDecode<F>(nullptr, nullptr, 4000, d, nullptr, nullptr, scratch, &bytes, 0),
              cudaSuccess);
  ReportError("no GPU: sum_pairs per index ->",
              cuda::SumPairsPerIndex(rows, 4000, rows, counts, counts + 1, scratch, &bytes, 0), cudaSuccess);
  ReportError("no GPU: sum_pairs per index, n = 0 ->",
              cuda::SumPairsPerIndex(rows, 0, rows, counts, counts + 1, scratch, &bytes, 0), cudaSuccess);
  ReportError("no GPU: sum_pairs keep ->", cuda::SumPairsKeep(rows, 4000, 100, rows, scratch, &bytes, 0), cudaSuccess);
  ReportError("no GPU: sum_pairs keep, every sum ->", cuda::SumPairsKeep(rows, 4000, -1, rows, scratch, &bytes, 0),
              cudaSuccess);
  return failures;
}

// ---------------------------------------------------------------------------------------------
// --bench (float32)

// One pass reading the tensor and nothing else: every thread folds its elements into an XOR and
// writes only if the fold equals `never` (a value the caller picks so that it never does), so the
// loads cannot be optimised away and no write or atomic adds to the time.
__global__ void ReadFloor(const uint32_t* grad, int64_t size, uint32_t never, unsigned int* out) {
  uint32_t fold = 0;
  cuda::ForEachElement(grad, size, [&](int64_t, uint32_t bits) { fold ^= bits; });
  if (fold == never) *out = fold;
}

// The floor of a fused pass that reads two float32 tensors and writes a third: sum = a + b.
__global__ void AddFloor(const float* a, const float* b, float* sum, int64_t size) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t num_vectors = size / 4;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < num_vectors; v += stride) {
    const float4 x = __ldg(reinterpret_cast<const float4*>(a) + v);
    const float4 y = __ldg(reinterpret_cast<const float4*>(b) + v);
    reinterpret_cast<float4*>(sum)[v] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
  }
}

// Median time in milliseconds of `runs` launches after 3 warm-up launches.
template <class Launch>
double MedianMs(int runs, const Launch& launch) {
  cudaEvent_t start, stop;
  HARNESS_CUDA(cudaEventCreate(&start));
  HARNESS_CUDA(cudaEventCreate(&stop));
  for (int w = 0; w < 3; ++w) HARNESS_CUDA(launch());
  std::vector<float> times(runs);
  for (float& ms : times) {
    HARNESS_CUDA(cudaEventRecord(start));
    HARNESS_CUDA(launch());
    HARNESS_CUDA(cudaEventRecord(stop));
    HARNESS_CUDA(cudaEventSynchronize(stop));
    HARNESS_CUDA(cudaEventElapsedTime(&ms, start, stop));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[runs / 2];
}

void Result(const char* op, int64_t d, double ms) {
  std::printf("RESULT\t%s\t%lld\t%.4f\n", op, static_cast<long long>(d), ms);
  std::fflush(stdout);
}

template <class Launch>
void Time(const char* op, int64_t d, int runs, const Launch& launch) {
  Result(op, d, MedianMs(runs, launch));
}

// A dragonn_compress launch(scratch, bytes, scratch_is_zero) as TimeWithScratch takes it, run as the
// op runs it: the first call on the scratch zeroes its slots, each later one finds them left zero.
template <class Launch>
auto KeepingSlotsZero(const Launch& launch) {
  return [launch, zero = std::make_shared<bool>(false)](void* scratch, size_t* bytes) {
    const cudaError_t error = launch(scratch, bytes, *zero);
    *zero = scratch != nullptr && error == cudaSuccess;
    return error;
  };
}

// As Time, for a launcher that takes scratch: the scratch is allocated once, outside the timing.
template <class Launch>
void TimeWithScratch(const char* op, int64_t d, int runs, const Launch& launch) {
  size_t bytes;
  DeviceArray<char> scratch = ScratchFor(launch, &bytes);
  Time(op, d, runs, [&]() { return launch(scratch.get(), &bytes); });
}

void RunBench(int min_log2, int max_log2, int runs, float ratio) {
  using Format = Float32Format;
  int device = 0, driver = 0, runtime = 0;
  cudaDeviceProp prop;
  HARNESS_CUDA(cudaGetDevice(&device));
  HARNESS_CUDA(cudaGetDeviceProperties(&prop, device));
  HARNESS_CUDA(cudaDriverGetVersion(&driver));
  HARNESS_CUDA(cudaRuntimeGetVersion(&runtime));
  std::printf("GPU\t%s\nCUDA_DRIVER_API\t%d\nCUDA_RUNTIME\t%d\nRUNS\t%d\nRATIO\t%g\n", prop.name, driver, runtime, runs,
              ratio);
  cudaStream_t stream = 0;
  for (int log2 = min_log2; log2 <= max_log2; ++log2) {
    const int64_t d = int64_t{1} << log2;
    const int64_t budget = std::max<int64_t>(1, std::llround(ratio * d));
    const DeviceArray<uint32_t> grad(MakeGradient<Format>(d, 1000 + log2));
    const DeviceArray<int64_t> seed(std::vector<int64_t>{42});
    DeviceArray<float> threshold(1);
    DeviceArray<unsigned int> largest(1);
    DeviceArray<uint32_t> values(budget);
    DeviceArray<int32_t> indices(budget);
    DeviceArray<uint32_t> dense(d);

    Time("read_floor", d, runs, [&]() {
      ReadFloor<<<cuda::PassBlocks<uint32_t>(d), cuda::kThreads, 0, stream>>>(grad.get(), d, 0x7FC00001u,
                                                                               largest.get());
      return cudaGetLastError();
    });
    TimeWithScratch("estimate_threshold", d, runs, [&](void* scratch, size_t* bytes) {
      return cuda::EstimateThreshold<Format>(grad.get(), d, std::min<int64_t>(65536, d),
                                             SampleRank(ratio, std::min<int64_t>(65536, d)), seed.get(),
                                             threshold.get(), scratch, bytes, stream);
    });
    TimeWithScratch("dragonn_compress", d, runs, KeepingSlotsZero([&](void* scratch, size_t* bytes, bool zero) {
      return cuda::DragonnCompress<Format>(grad.get(), d, threshold.get(), seed.get(), budget, values.get(),
                                           indices.get(), scratch, bytes, stream, nullptr, nullptr, zero);
    }));
    // A call whose scratch no call left zero (one launch more: the slots' zeroing).
    TimeWithScratch("dragonn_compress_zeroing", d, runs, [&](void* scratch, size_t* bytes) {
      return cuda::DragonnCompress<Format>(grad.get(), d, threshold.get(), seed.get(), budget, values.get(),
                                           indices.get(), scratch, bytes, stream);
    });
    // What DRAGONN's pass costs beyond the floor when no element is selected (no atomics at all).
    const DeviceArray<float> above_all(std::vector<float>{std::numeric_limits<float>::infinity()});
    TimeWithScratch("dragonn_nothing_selected", d, runs, KeepingSlotsZero([&](void* scratch, size_t* bytes, bool zero) {
      return cuda::DragonnCompress<Format>(grad.get(), d, above_all.get(), seed.get(), budget, values.get(),
                                           indices.get(), scratch, bytes, stream, nullptr, nullptr, zero);
    }));
    // The exchange's error-feedback pass: grad + residual, written and hashed at once, against a
    // plain a + b pass over the same tensors.
    const DeviceArray<uint32_t> residual(MakeGradient<Format>(d, 2000 + log2));
    DeviceArray<uint32_t> sum(d);
    Time("add_floor", d, runs, [&]() {
      AddFloor<<<cuda::PassBlocks<uint32_t>(d), cuda::kThreads, 0, stream>>>(
          reinterpret_cast<const float*>(grad.get()), reinterpret_cast<const float*>(residual.get()),
          reinterpret_cast<float*>(sum.get()), d);
      return cudaGetLastError();
    });
    TimeWithScratch("dragonn_compress_addend", d, runs, KeepingSlotsZero([&](void* scratch, size_t* bytes, bool zero) {
      return cuda::DragonnCompress<Format>(grad.get(), d, threshold.get(), seed.get(), budget, values.get(),
                                           indices.get(), scratch, bytes, stream, residual.get(), sum.get(), zero);
    }));
    // DGC's momentum correction: reads gradient, momentum and residual, writes momentum and sum.
    DeviceArray<uint32_t> accumulated(d);
    Time("momentum_accumulate", d, runs, [&]() {
      return cuda::MomentumAccumulate(reinterpret_cast<const float*>(grad.get()),
                                      reinterpret_cast<const float*>(residual.get()),
                                      reinterpret_cast<const float*>(sum.get()), d, 0.9f,
                                      reinterpret_cast<float*>(dense.get()),
                                      reinterpret_cast<float*>(accumulated.get()), stream);
    });
    const DeviceArray<float> quantize_scale(std::vector<float>{1.0f});
    DeviceArray<int32_t> lanes(d / 4 + 1);
    Time("int_quantize_8", d, runs, [&]() {
      return cuda::IntQuantize(reinterpret_cast<const float*>(grad.get()), d, quantize_scale.get(), seed.get(), 8, 42,
                               lanes.get(), stream);
    });
    Time("int_dequantize_8", d, runs, [&]() {
      return cuda::IntDequantize(lanes.get(), d, quantize_scale.get(), 8, reinterpret_cast<float*>(sum.get()),
                                 stream);
    });
    TimeWithScratch("dgc_compress", d, runs, [&](void* scratch, size_t* bytes) {
      return cuda::DgcCompress<Format>(grad.get(), d, threshold.get(), budget, values.get(), indices.get(), scratch,
                                       bytes, stream);
    });
    TimeWithScratch("topk_compress", d, runs, [&](void* scratch, size_t* bytes) {
      return cuda::TopkCompress<Format>(grad.get(), d, budget, values.get(), indices.get(), scratch, bytes, stream);
    });
    DeviceArray<int64_t> first_bad(1);
    for (int payloads : {1, 4, 16, 64}) {
      std::vector<uint32_t> pair_values;
      std::vector<int32_t> pair_indices;
      MakePairs<Format>(payloads, budget, d, 7 + payloads, &pair_values, &pair_indices);
      const DeviceArray<uint32_t> d_values(pair_values);
      const DeviceArray<int32_t> d_indices(pair_indices);
      const std::string op = "decode_K" + std::to_string(payloads);
      TimeWithScratch(op.c_str(), d, runs, [&](void* scratch, size_t* bytes) {
        return cuda::SparseBatchedDecode<Format>(d_values.get(), d_indices.get(), payloads * budget, d, dense.get(),
                                                 first_bad.get(), scratch, bytes, stream);
      });
    }
  }
}

// ---------------------------------------------------------------------------------------------
// --loads: why DRAGONN's hashing pass streams its loads. The floor and the pass (float32, ratio's
// slots, no memset or unpack) each with read-only-cache loads (__ldg) and with streaming loads
// (__ldcs: evict first, so that the slots' lines stay in L2; ForEachElement's), timed in
// interleaved rounds; prints "LOADS<TAB>variant<TAB>round<TAB>median_ms" and one median of medians
// per variant.
template <bool kStreaming>
__device__ __forceinline__ uint4 LoadVector(const uint4* p) {
  if constexpr (kStreaming) {
    return __ldcs(p);
  } else {
    return __ldg(p);
  }
}

template <bool kStreaming>
__global__ void FloorPass(const uint32_t* grad, int64_t num_vectors, uint32_t never, unsigned int* out) {
  uint32_t fold = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < num_vectors; v += stride) {
    const uint4 c = LoadVector<kStreaming>(reinterpret_cast<const uint4*>(grad) + v);
    fold ^= c.x ^ c.y ^ c.z ^ c.w;
  }
  if (fold == never) *out = fold;
}

template <bool kStreaming>
__global__ void HashPass(const uint32_t* grad, int64_t num_vectors, const float* threshold, const int64_t* seed,
                         uint32_t num_slots, unsigned long long* slots) {
  const uint32_t threshold_key = ThresholdKey<Float32Format>(*threshold);
  const SlotHash hash = SlotHash::FromSeed(static_cast<uint64_t>(*seed), num_slots);
  auto visit = [&](int64_t i, uint32_t bits) {
    if (IsSelected<Float32Format>(bits, threshold_key)) {
      atomicMax(slots + hash(static_cast<uint32_t>(i)),
                static_cast<unsigned long long>(SlotWord<Float32Format>(bits, i)));
    }
  };
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < num_vectors; v += stride) {
    const uint4 c = LoadVector<kStreaming>(reinterpret_cast<const uint4*>(grad) + v);
    visit(4 * v, c.x);
    visit(4 * v + 1, c.y);
    visit(4 * v + 2, c.z);
    visit(4 * v + 3, c.w);
  }
}

void RunLoads(int log2, int runs, int rounds, float ratio) {
  const int64_t d = int64_t{1} << log2, num_vectors = d / 4;
  const int64_t num_slots = std::max<int64_t>(1, std::llround(ratio * d));
  const DeviceArray<uint32_t> grad(MakeGradient<Float32Format>(d, 1000 + log2));
  const DeviceArray<int64_t> seed(std::vector<int64_t>{42});
  DeviceArray<float> threshold(1);
  DeviceArray<unsigned int> out(1);
  DeviceArray<unsigned long long> slots(num_slots);
  RunWithScratch([&](void* scratch, size_t* bytes) {
    return cuda::EstimateThreshold<Float32Format>(grad.get(), d, std::min<int64_t>(65536, d),
                                                  SampleRank(ratio, std::min<int64_t>(65536, d)), seed.get(),
                                                  threshold.get(), scratch, bytes, 0);
  });
  const unsigned int blocks = cuda::PassBlocks<uint32_t>(d);
  const std::vector<std::pair<std::string, std::function<cudaError_t()>>> variants = {
      {"floor_ldg", [&]() { FloorPass<false><<<blocks, cuda::kThreads>>>(grad.get(), num_vectors, 1u, out.get());
                            return cudaGetLastError(); }},
      {"floor_ldcs", [&]() { FloorPass<true><<<blocks, cuda::kThreads>>>(grad.get(), num_vectors, 1u, out.get());
                             return cudaGetLastError(); }},
      {"hash_ldg", [&]() { HashPass<false><<<blocks, cuda::kThreads>>>(grad.get(), num_vectors, threshold.get(),
                                                                      seed.get(), num_slots, slots.get());
                           return cudaGetLastError(); }},
      {"hash_ldcs", [&]() { HashPass<true><<<blocks, cuda::kThreads>>>(grad.get(), num_vectors, threshold.get(),
                                                                      seed.get(), num_slots, slots.get());
                            return cudaGetLastError(); }},
  };
  std::map<std::string, std::vector<double>> medians;
  for (int round = 0; round < rounds; ++round) {
    for (const auto& [name, launch] : variants) {
      const double ms = MedianMs(runs, launch);
      medians[name].push_back(ms);
      std::printf("LOADS\t%s\t%d\t%.4f\n", name.c_str(), round, ms);
    }
  }
  for (auto& [name, values] : medians) {
    std::sort(values.begin(), values.end());
    std::printf("LOADS_MEDIAN\t%s\t%lld\t%.4f\n", name.c_str(), static_cast<long long>(d), values[values.size() / 2]);
  }
}

int ArgInt(int argc, char** argv, const char* name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  }
  return fallback;
}

}  // namespace
}  // namespace harness
}  // namespace tfcomp

int main(int argc, char** argv) {
  using namespace tfcomp::harness;
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "--self-check") {
    const int reference_failed = RunSelfCheck(ArgInt(argc, argv, "--seed", 1));
    CheckSumPairsHost(ArgInt(argc, argv, "--seed", 1));
    const int failed = reference_failed + CheckLaunchers();  // the harness's failures, CheckSumPairsHost's included
    std::printf("self-check: %s (%d failed)\n", failed == 0 ? "PASSED" : "FAILED", failed);
    return failed == 0 ? 0 : 1;
  }
  if (mode == "--check") {
    const int failed = RunCheck(ArgInt(argc, argv, "--max-log2", 27));
    std::printf("GPU check: %s (%d failed)\n", failed == 0 ? "PASSED" : "FAILED", failed);
    return failed == 0 ? 0 : 1;
  }
  if (mode == "--bench") {
    float ratio = 0.001f;
    for (int i = 1; i + 1 < argc; ++i) {
      if (std::strcmp(argv[i], "--ratio") == 0) ratio = std::strtof(argv[i + 1], nullptr);
    }
    RunBench(ArgInt(argc, argv, "--min-log2", 20), ArgInt(argc, argv, "--max-log2", 27),
             std::max(1, ArgInt(argc, argv, "--runs", 21)), ratio);
    return 0;
  }
  if (mode == "--loads") {
    RunLoads(ArgInt(argc, argv, "--log2", 27), std::max(1, ArgInt(argc, argv, "--runs", 21)),
             std::max(1, ArgInt(argc, argv, "--rounds", 7)), 0.001f);
    return 0;
  }
  std::fprintf(stderr,
               "usage: %s --self-check | --check [--max-log2 N] | --bench [--min-log2 N] [--max-log2 N] "
               "[--runs N] [--ratio R] | --loads [--log2 N] [--runs N] [--rounds N]\n",
               argv[0]);
  return 2;
}
