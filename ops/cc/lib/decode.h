// Sparse batched decoding (004 Sec. 4.3) on the CPU, framework-free.
//
// Scattering n pairs at random into a dense vector of many megabytes costs a cache and TLB miss per
// pair. The decode therefore sorts the pairs by output chunk first (a stable counting sort, done in
// parallel over ranges of pairs), then zeroes and fills each chunk while it sits in cache. Every
// output element receives its additions in pair order, so the sum is deterministic.
#ifndef TFCOMP_OPS_CC_LIB_DECODE_H_
#define TFCOMP_OPS_CC_LIB_DECODE_H_

#include <cstdint>

namespace tfcomp {

// Output elements per chunk: 16 Ki elements (64 KiB of float32) fit in any L2 cache.
constexpr int kDecodeChunkLog2 = 14;

inline int64_t NumDecodeChunks(int64_t size) {
  return (size + (int64_t{1} << kDecodeChunkLog2) - 1) >> kDecodeChunkLog2;
}

// Counts the pairs of indices[begin, end) that fall in each chunk (index -1 counts nowhere).
// Returns the position of the first index outside [-1, size), or -1 when all are valid.
inline int64_t CountPairsPerChunk(const int32_t* indices, int64_t begin, int64_t end, int64_t size,
                                  int64_t* chunk_counts) {
  for (int64_t p = begin; p < end; ++p) {
    const int64_t index = indices[p];
    if (index < -1 || index >= size) return p;
    if (index >= 0) ++chunk_counts[index >> kDecodeChunkLog2];
  }
  return -1;
}

// Moves the pairs of [begin, end) to their chunk's slots: chunk_cursor[c] is where the next pair of
// chunk c goes, and is advanced.
template <typename T>
inline void SortPairsIntoChunks(const T* values, const int32_t* indices, int64_t begin, int64_t end,
                                int64_t* chunk_cursor, T* sorted_values, int32_t* sorted_indices) {
  for (int64_t p = begin; p < end; ++p) {
    const int32_t index = indices[p];
    if (index < 0) continue;
    const int64_t slot = chunk_cursor[index >> kDecodeChunkLog2]++;
    sorted_values[slot] = values[p];
    sorted_indices[slot] = index;
  }
}

// Zeroes chunk c of dense (of length size) and adds the chunk's sorted pairs [first, last).
template <typename T>
inline void FillChunk(const T* sorted_values, const int32_t* sorted_indices, int64_t first, int64_t last,
                      int64_t chunk, int64_t size, T* dense) {
  const int64_t lo = chunk << kDecodeChunkLog2;
  const int64_t hi = lo + (int64_t{1} << kDecodeChunkLog2) < size ? lo + (int64_t{1} << kDecodeChunkLog2) : size;
  for (int64_t i = lo; i < hi; ++i) dense[i] = T(0);
  for (int64_t p = first; p < last; ++p) dense[sorted_indices[p]] += sorted_values[p];
}

}  // namespace tfcomp

#endif  // TFCOMP_OPS_CC_LIB_DECODE_H_
