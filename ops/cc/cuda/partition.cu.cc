// CUDA hash_partition: a count launch and a write launch, one thread per chunk of pairs, each
// walking its chunk in order, so that the rows come out as on the CPU (owner by owner, input order
// within an owner). See tfcomp_cuda.h.
#include "ops/cc/cuda/device_util.cuh"
#include "ops/cc/cuda/tfcomp_cuda.h"
#include "ops/cc/lib/partition.h"

namespace tfcomp {
namespace cuda {
namespace {

__global__ void CountKernel(const int32_t* indices, int64_t n, int32_t num_parts, int64_t num_chunks,
                            int32_t* counts, int64_t* first_bad) {
  const int64_t chunk = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (chunk >= num_chunks) return;
  int32_t* row = counts + chunk * num_parts;
  for (int32_t p = 0; p < num_parts; ++p) row[p] = 0;
  first_bad[chunk] = n;
  const int64_t end = min(n, (chunk + 1) * kPartitionChunk);
  for (int64_t i = chunk * kPartitionChunk; i < end; ++i) {
    const int32_t index = indices[i];
    if (index >= 0) {
      ++row[HashOwner(index, num_parts)];
    } else if (index < -1) {
      first_bad[chunk] = i;
      return;
    }
  }
}

__global__ void WriteKernel(const float* values, const int32_t* indices, int64_t n, int32_t num_parts,
                            int64_t num_chunks, int64_t* cursors, int32_t* rows) {
  const int64_t chunk = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (chunk >= num_chunks) return;
  int64_t* cursor = cursors + chunk * num_parts;
  const int64_t end = min(n, (chunk + 1) * kPartitionChunk);
  for (int64_t i = chunk * kPartitionChunk; i < end; ++i) {
    const int32_t index = indices[i];
    if (index < 0) continue;
    const int64_t row = cursor[HashOwner(index, num_parts)]++;
    rows[2 * row] = index;
    rows[2 * row + 1] = static_cast<int32_t>(FloatToBits(values[i]));
  }
}

bool ValidArguments(int64_t n, int32_t num_parts) { return n >= 0 && n <= kMaxElements && num_parts >= 1; }

}  // namespace

int64_t PartitionChunks(int64_t n) { return (n + kPartitionChunk - 1) / kPartitionChunk; }

cudaError_t HashPartitionCount(const int32_t* indices, int64_t n, int32_t num_parts, int32_t* counts,
                               int64_t* first_bad, cudaStream_t stream) {
  if (!ValidArguments(n, num_parts)) return cudaErrorInvalidValue;
  const int64_t chunks = PartitionChunks(n);
  if (chunks == 0) return cudaSuccess;
  CountKernel<<<NumBlocks(chunks, kThreads), kThreads, 0, stream>>>(indices, n, num_parts, chunks, counts, first_bad);
  TFCOMP_CUDA_RETURN_IF_LAUNCH_FAILED();
  return cudaSuccess;
}

cudaError_t HashPartitionWrite(const float* values, const int32_t* indices, int64_t n, int32_t num_parts,
                               int64_t* cursors, int32_t* rows, cudaStream_t stream) {
  if (!ValidArguments(n, num_parts)) return cudaErrorInvalidValue;
  const int64_t chunks = PartitionChunks(n);
  if (chunks == 0) return cudaSuccess;
  WriteKernel<<<NumBlocks(chunks, kThreads), kThreads, 0, stream>>>(values, indices, n, num_parts, chunks, cursors,
                                                                    rows);
  TFCOMP_CUDA_RETURN_IF_LAUNCH_FAILED();
  return cudaSuccess;
}

}  // namespace cuda
}  // namespace tfcomp
