// CUDA implementations of the tfcomp ops, framework-free: raw device pointers and a cudaStream_t.
//
// Used by the TensorFlow GPU kernels (ops/cc/cuda/gpu_launchers.cc) and by the standalone harness
// (benchmarks/gpu/), which is built from the same sources with nvcc and no TensorFlow.
//
// Conventions, for every function below:
//   * Format is Float32Format, Float16Format or BFloat16Format (ops/cc/lib/magnitude.h); tensors of
//     float32, float16 and bfloat16 are passed as their raw bits (Format::Bits: uint32_t or uint16_t).
//   * All pointers are device pointers. Scalars that other ops produce (threshold, seed) stay on the
//     device, so an encode never waits for the host: outputs have sizes fixed by attributes.
//   * Scratch is CUB-style: with scratch == nullptr the function only stores the bytes it needs in
//     *scratch_bytes and launches nothing; call it again with a device buffer of that size.
//   * Work is enqueued on `stream`; nothing synchronises. The return value is the first CUDA error
//     met (cudaErrorInvalidValue for arguments out of range), cudaSuccess otherwise.
//   * Gradients hold < 2^31 elements (indices are int32), and so do the sample and the outputs.
//   * Results are those of the CPU kernels (ops/cc/kernels/) for the same inputs and seed.
#ifndef TFCOMP_OPS_CC_CUDA_TFCOMP_CUDA_H_
#define TFCOMP_OPS_CC_CUDA_TFCOMP_CUDA_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "ops/cc/lib/accumulate.h"
#include "ops/cc/lib/magnitude.h"
#include "ops/cc/lib/parts.h"

namespace tfcomp {
namespace cuda {

// estimate_threshold: *threshold (float32, device) = the k-th largest finite |g| of the n samples
// at SamplePosition(i, n, size, *seed) (every element when n == size), Format::kMaxFiniteKey's value
// when no sample is finite, of a gradient of `size` elements in `count` parts (`parts`: a host array
// of device pointers; ops/cc/lib/parts.h), 1 <= n <= size, 1 <= k (k > n acts as k = n). Where a
// part has an addend (float32 only) its samples are of grad + addend. One gather launch per part.
template <class Format>
cudaError_t EstimateThresholdParts(const GradientPart<typename Format::Bits>* parts, int count, int64_t size,
                                   int64_t n, int64_t k, const int64_t* seed, float* threshold, void* scratch,
                                   size_t* scratch_bytes, cudaStream_t stream);

// EstimateThresholdParts of one tensor.
template <class Format>
inline cudaError_t EstimateThreshold(const typename Format::Bits* grad, int64_t size, int64_t n, int64_t k,
                                     const int64_t* seed, float* threshold, void* scratch, size_t* scratch_bytes,
                                     cudaStream_t stream, const typename Format::Bits* addend = nullptr) {
  const GradientPart<typename Format::Bits> part{grad, addend, nullptr, 0, size};
  return EstimateThresholdParts<Format>(&part, 1, size, n, k, seed, threshold, scratch, scratch_bytes, stream);
}

// dragonn_compress: every element with |g| >= *threshold (NaN and Inf always) competes for slot
// SlotHash::FromSeed(*seed, num_slots)(index) with an atomicMax of its SlotWord; then the slots are
// unpacked. The gradient: `size` elements in `count` parts (`parts`: a host array of device
// pointers; ops/cc/lib/parts.h), indexed as their concatenation, one hashing launch per part;
// values: [num_slots] Format::Bits; indices: [num_slots] int32 (-1: empty). Where a part has an
// addend (float32 only) its elements are g = grad + addend, written to the part's sum in the same
// pass. The scratch's slots are zeroed first unless scratch_is_zero, and a call that returns
// cudaSuccess leaves them zero once its kernels ran: a caller that keeps its scratch for the next
// call on the same stream passes scratch_is_zero = true and saves a launch (the scratch size depends
// on num_slots alone; a smaller num_slots may reuse a larger call's scratch).
template <class Format>
cudaError_t DragonnCompressParts(const GradientPart<typename Format::Bits>* parts, int count, int64_t size,
                                 const float* threshold, const int64_t* seed, int64_t num_slots,
                                 typename Format::Bits* values, int32_t* indices, void* scratch, size_t* scratch_bytes,
                                 bool scratch_is_zero, cudaStream_t stream);

// DragonnCompressParts of one tensor.
template <class Format>
inline cudaError_t DragonnCompress(const typename Format::Bits* grad, int64_t size, const float* threshold,
                                   const int64_t* seed, int64_t num_slots, typename Format::Bits* values,
                                   int32_t* indices, void* scratch, size_t* scratch_bytes, cudaStream_t stream,
                                   const typename Format::Bits* addend = nullptr,
                                   typename Format::Bits* sum = nullptr, bool scratch_is_zero = false) {
  const GradientPart<typename Format::Bits> part{grad, addend, sum, 0, size};
  return DragonnCompressParts<Format>(&part, 1, size, threshold, seed, num_slots, values, indices, scratch,
                                      scratch_bytes, scratch_is_zero, stream);
}

// dgc_compress: the first max_out elements with |g| >= *threshold in index order, padded with
// index -1 and value 0: a mask and count per tile, a prefix sum over tiles (CUB), and a compaction
// that re-reads each tile and scans it within the block. values, indices: [max_out].
template <class Format>
cudaError_t DgcCompress(const typename Format::Bits* grad, int64_t size, const float* threshold, int64_t max_out,
                        typename Format::Bits* values, int32_t* indices, void* scratch, size_t* scratch_bytes,
                        cudaStream_t stream);

// topk_compress: the k elements of largest RankWord (magnitude, then larger index), in increasing
// index order: a CUB radix sort of the rank words, then a sort of the k winning indices.
// 1 <= k <= size; values, indices: [k].
template <class Format>
cudaError_t TopkCompress(const typename Format::Bits* grad, int64_t size, int64_t k, typename Format::Bits* values,
                         int32_t* indices, void* scratch, size_t* scratch_bytes, cudaStream_t stream);

// sparse_batched_decode: dense[size] = the sum of the n pairs (values[p], indices[p]), for example
// K workers' payloads concatenated: the pairs sorted by index (stable), then every output tile
// written once with its indices' sums, each added in pair order in the format's arithmetic, so the
// result is deterministic and equals the CPU kernel's bit for bit (NaN payloads aside). Index -1 is skipped. An index
// < -1 or >= size is not added; the smallest such pair position is left in *first_bad (device),
// which holds a value >= n when every index is valid. Needs scratch (about 8 bytes per pair).
template <class Format>
cudaError_t SparseBatchedDecode(const typename Format::Bits* values, const int32_t* indices, int64_t n, int64_t size,
                                typename Format::Bits* dense, int64_t* first_bad, void* scratch, size_t* scratch_bytes,
                                cudaStream_t stream);

// zero_at: data[i - offset] = 0 for every index i = indices[p] (device) with offset <= i < offset +
// size; the other indices are skipped. Needs no scratch.
cudaError_t ZeroAt(float* data, int64_t size, const int32_t* indices, int64_t n, int64_t offset, cudaStream_t stream);

// int_quantize: lanes[ceil(size / (32 / bits))] = the levels of grad (ops/cc/lib/quantize.h), scale
// and seed on the device; bits 4, 8 or 16, 1 <= levels <= 2^(bits-1) - 1. Needs no scratch.
cudaError_t IntQuantize(const float* grad, int64_t size, const float* scale, const int64_t* seed, int bits,
                        int32_t levels, int32_t* lanes, cudaStream_t stream);

// int_dequantize: dense[size] = the signed fields of the lanes times *step (device). Needs no scratch.
cudaError_t IntDequantize(const int32_t* lanes, int64_t size, const float* step, int bits, float* dense,
                          cudaStream_t stream);

// momentum_accumulate: MomentumAccumulateAt (ops/cc/lib/accumulate.h) for every i < size; residual
// and accumulated may be null. Needs no scratch. Here and in adam_accumulate every result is the
// CPU's bit for bit except a NaN, whose payload and sign are the GPU arithmetic's (measured on an H100).
cudaError_t MomentumAccumulate(const float* grad, const float* momentum, const float* residual, int64_t size, float mu,
                               float* new_momentum, float* accumulated, cudaStream_t stream);

// adam_accumulate: AdamAccumulateAt for every i < size, with the bias corrections *m_correction and
// *v_correction (device scalars) in place of the constants' own; residual may be null. Needs no
// scratch.
cudaError_t AdamAccumulate(const float* grad, const float* m, const float* v, const float* residual, int64_t size,
                           AdamCoefficients constants, const float* m_correction, const float* v_correction,
                           float* new_m, float* new_v, float* accumulated, cudaStream_t stream);

// hash_partition, in two launches around the host, one thread per chunk of kPartitionChunk pairs
// (PartitionChunks(n) chunks), each walking its chunk in order. HashPartitionCount writes, for chunk
// c, its pairs of index >= 0 per owner (HashOwner) to counts[c * num_parts + owner] (device int32)
// and the position of its first index < -1 to first_bad[c] (device int64; n where none). The host
// turns the counts into cursors, the exclusive sum in (owner, chunk) order, and HashPartitionWrite
// writes every chunk's pairs as rows (index, value bits) at its cursors (device int64, advanced), so
// that the rows come owner by owner, in input order within an owner, as on the CPU. No scratch.
constexpr int64_t kPartitionChunk = 256;
int64_t PartitionChunks(int64_t n);
cudaError_t HashPartitionCount(const int32_t* indices, int64_t n, int32_t num_parts, int32_t* counts,
                               int64_t* first_bad, cudaStream_t stream);
cudaError_t HashPartitionWrite(const float* values, const int32_t* indices, int64_t n, int32_t num_parts,
                               int64_t* cursors, int32_t* rows, cudaStream_t stream);

// A float32 denormal's bits as those of the zero of its sign; other bits unchanged.
TFCOMP_HOST_DEVICE inline uint32_t FlushDenormalBits(uint32_t bits) {
  return (bits & 0x7F800000u) == 0 ? bits & 0x80000000u : bits;
}

// sum_pairs's addition, on the device and the host: the float32 bits of a + b as TensorFlow's CPU
// threads add (the CPU kernel's): denormal operands read as zeros of their sign, one rounding (no
// FMA, no reassociation), a denormal result flushed to a zero of its sign; and where the sum is
// NaN, the NaN of x86-64's SSE addition with the running sum as first operand: a quieted when a is
// NaN, else b quieted when b is NaN, else (Inf plus -Inf) the default NaN 0xFFC00000. A GPU's own
// NaN (0x7FFFFFFF) would differ, and a NaN's bits are part of its SelectionKey.
TFCOMP_HOST_DEVICE inline uint32_t SumPairsAdd(uint32_t a, uint32_t b) {
  constexpr uint32_t kAbs = 0x7FFFFFFFu, kExponent = 0x7F800000u, kQuiet = 0x00400000u;
  const float x = BitsToFloat(FlushDenormalBits(a)), y = BitsToFloat(FlushDenormalBits(b));
#if defined(__CUDA_ARCH__)
  const uint32_t sum = FlushDenormalBits(FloatToBits(__fadd_rn(x, y)));
#else
  const uint32_t sum = FlushDenormalBits(FloatToBits(x + y));
#endif
  if ((sum & kAbs) <= kExponent) return sum;
  if ((a & kAbs) > kExponent) return a | kQuiet;
  if ((b & kAbs) > kExponent) return b | kQuiet;
  return 0xFFC00000u;
}

// sum_pairs, bit for bit the CPU kernel as TensorFlow runs it (ops/cc/lib/sum_pairs.h, denormals
// flushed), in two calls around the host, which learns the number m of distinct indices (the
// output's shape) in between. rows: [n, 2] int32 (index, float32 bits), n <= 2^31 - 1.
//
// SumPairsPerIndex: *first_negative (device int64) = the first row whose index is negative, a value
// >= n when there is none (a pass over the rows, which it also splits into indices and values), and
// then, valid only when there is none: the rows sorted stably by index (a CUB radix sort of the 31
// index bits, the values carried), the sorted runs numbered (run heads, an inclusive sum), and one
// thread per run adding 0 and then its values in row order with SumPairsAdd; sums[2 j] and
// sums[2 j + 1] = the j-th smallest distinct index and the bits of its sum, j < m, and *distinct
// (device int64) = m. sums has room for n rows. Needs scratch (about 16 bytes per row).
// first_negative and distinct are never null; rows and sums not where n > 0.
cudaError_t SumPairsPerIndex(const int32_t* rows, int64_t n, int32_t* sums, int64_t* first_negative,
                             int64_t* distinct, void* scratch, size_t* scratch_bytes, cudaStream_t stream);

// SumPairsKeep: kept[2 k], kept[2 k + 1] = the rows of sums (m of them, SumPairsPerIndex's) whose
// SelectionKey is among the max_pairs smallest, in their order (ascending index): k = min(m,
// max_pairs) rows, all m when max_pairs is -1 (then a copy). Selecting (0 < max_pairs < m): a CUB
// radix sort of the m 64-bit keys gives the limit, the max_pairs-th smallest (keys are unique), then
// the rows with keys up to it are flagged and compacted in order (an exclusive sum). Needs scratch
// (about 24 bytes per sum) only when selecting. max_pairs >= -1; sums and kept not null where k > 0.
cudaError_t SumPairsKeep(const int32_t* sums, int64_t m, int64_t max_pairs, int32_t* kept, void* scratch,
                         size_t* scratch_bytes, cudaStream_t stream);

}  // namespace cuda
}  // namespace tfcomp

#endif  // TFCOMP_OPS_CC_CUDA_TFCOMP_CUDA_H_
