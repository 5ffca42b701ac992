// GPU launchers of the tfcomp ops (ops/cc/kernels/launchers.h), compiled only in the CUDA build
// (--config=cuda). The OpKernels of ops/cc/kernels/ check the arguments and allocate the outputs for
// every device; these launchers allocate their scratch (allocate_temp, sized by the CUDA launcher's
// query) and enqueue the framework-free CUDA code of tfcomp_cuda.h on the op's stream. A CUDA error
// becomes an Internal error naming the op.
// Nothing here waits for the device except the decode, which synchronises its stream once, after the
// decode, to report an index out of range, and hash_partition and sum_pairs, whose output shapes
// depend on the data: each synchronises once before allocating them. Threshold and seed stay in
// device memory (their values are not checked, see ops/cc/kernels/checks.h); estimate_threshold's
// ratio is in host memory.
// First: included after TensorFlow's logging, stream_executor's absl/log/check.h redefines CHECK.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "ops/cc/cuda/tfcomp_cuda.h"
#include "ops/cc/kernels/checks.h"
#include "ops/cc/kernels/kernel_util.h"
#include "ops/cc/kernels/launchers.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/platform/stream_executor.h"

namespace tfcomp {

using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
namespace errors = ::tensorflow::errors;

namespace {

// A CUDA error as a TensorFlow error naming the op (never an abort).
Status CudaStatus(OpKernelContext* context, cudaError_t error) {
  if (error == cudaSuccess) return ::tensorflow::OkStatus();
  return errors::Internal(context->op_kernel().type_string(), " on GPU: ", cudaGetErrorName(error), ": ",
                          cudaGetErrorString(error));
}

// The CUDA stream TensorFlow runs this op on.
Status GetStream(OpKernelContext* context, cudaStream_t* stream) {
  const auto* device_context = context->op_device_context();
  if (device_context == nullptr || device_context->stream() == nullptr) {
    return errors::Internal(context->op_kernel().type_string(), " on GPU: the op has no GPU stream");
  }
  *stream = reinterpret_cast<cudaStream_t>(device_context->stream()->platform_specific_handle().stream);
  return ::tensorflow::OkStatus();
}

// Runs launch(scratch, &scratch_bytes, stream) CUB-style: a query for the scratch size, a scratch
// tensor from allocate_temp, then the launch.
template <class Launch>
Status LaunchWithScratch(OpKernelContext* context, const Launch& launch) {
  cudaStream_t stream;
  TF_RETURN_IF_ERROR(GetStream(context, &stream));
  size_t bytes = 0;
  TF_RETURN_IF_ERROR(CudaStatus(context, launch(nullptr, &bytes, stream)));
  Tensor scratch;
  TF_RETURN_IF_ERROR(
      context->allocate_temp(::tensorflow::DT_UINT8, {static_cast<int64_t>(std::max<size_t>(bytes, 1))}, &scratch));
  return CudaStatus(context, launch(scratch.flat<::tensorflow::uint8>().data(), &bytes, stream));
}

}  // namespace

template <typename T>
Status EstimateThresholdLauncher<GpuDevice, T>::operator()(OpKernelContext* context, const Parts<T>& parts,
                                                           int64_t total, int64_t n, int64_t k, const Tensor& seed,
                                                           Tensor* threshold) const {
  return LaunchWithScratch(context, [&](void* scratch, size_t* bytes, cudaStream_t stream) {
    return cuda::EstimateThresholdParts<typename FormatOf<T>::type>(
        parts.data(), static_cast<int>(parts.size()), total, n, k, seed.scalar<int64_t>().data(),
        threshold->scalar<float>().data(), scratch, bytes, stream);
  });
}

// The scratch is kept in `kept` from call to call (allocated again only for another stream or after
// a failed call); the lock orders the calls' launches on the stream, so each call finds the slots that
// the one before left zero.
template <typename T>
Status DragonnCompressLauncher<GpuDevice, T>::operator()(OpKernelContext* context, const Parts<T>& parts,
                                                         int64_t total, const Tensor& threshold, const Tensor& seed,
                                                         Tensor* values, Tensor* indices, DragonnScratch* kept) const {
  cudaStream_t stream;
  TF_RETURN_IF_ERROR(GetStream(context, &stream));
  auto launch = [&](void* scratch, size_t* bytes, bool scratch_is_zero) {
    return cuda::DragonnCompressParts<typename FormatOf<T>::type>(
        parts.data(), static_cast<int>(parts.size()), total, threshold.scalar<float>().data(),
        seed.scalar<int64_t>().data(), values->NumElements(), MutableBits<T>(values), indices->flat<int32_t>().data(),
        scratch, bytes, scratch_is_zero, stream);
  };
  size_t bytes = 0;
  TF_RETURN_IF_ERROR(CudaStatus(context, launch(nullptr, &bytes, false)));
  bytes = std::max<size_t>(bytes, 1);
  ::tensorflow::mutex_lock lock(kept->mu);
  const bool reuse = kept->slots_zero && kept->stream == stream &&
                     static_cast<size_t>(kept->buffer.NumElements()) >= bytes;
  if (!reuse) {
    TF_RETURN_IF_ERROR(context->allocate_temp(::tensorflow::DT_UINT8, {static_cast<int64_t>(bytes)}, &kept->buffer));
  }
  kept->slots_zero = false;
  size_t kept_bytes = kept->buffer.NumElements();
  TF_RETURN_IF_ERROR(CudaStatus(context, launch(kept->buffer.flat<::tensorflow::uint8>().data(), &kept_bytes, reuse)));
  kept->slots_zero = true;
  kept->stream = stream;
  return ::tensorflow::OkStatus();
}

template <typename T>
Status DgcCompressLauncher<GpuDevice, T>::operator()(OpKernelContext* context, const Tensor& grad,
                                                     const Tensor& threshold, Tensor* values, Tensor* indices) const {
  return LaunchWithScratch(context, [&](void* scratch, size_t* bytes, cudaStream_t stream) {
    return cuda::DgcCompress<typename FormatOf<T>::type>(
        AsBits(grad.flat<T>().data()), grad.NumElements(), threshold.scalar<float>().data(), values->NumElements(),
        MutableBits<T>(values), indices->flat<int32_t>().data(), scratch, bytes, stream);
  });
}

template <typename T>
Status TopkCompressLauncher<GpuDevice, T>::operator()(OpKernelContext* context, const Tensor& grad, Tensor* values,
                                                      Tensor* indices) const {
  return LaunchWithScratch(context, [&](void* scratch, size_t* bytes, cudaStream_t stream) {
    return cuda::TopkCompress<typename FormatOf<T>::type>(AsBits(grad.flat<T>().data()), grad.NumElements(),
                                                          values->NumElements(), MutableBits<T>(values),
                                                          indices->flat<int32_t>().data(), scratch, bytes, stream);
  });
}

template <typename T>
Status SparseBatchedDecodeLauncher<GpuDevice, T>::operator()(OpKernelContext* context, const Tensor& values,
                                                             const Tensor& indices, Tensor* dense,
                                                             int64_t* bad_position, int32_t* bad_index) const {
  const int64_t n = values.NumElements();
  Tensor first_bad_tensor;
  TF_RETURN_IF_ERROR(context->allocate_temp(::tensorflow::DT_INT64, {1}, &first_bad_tensor));
  int64_t* first_bad = first_bad_tensor.flat<int64_t>().data();
  const int32_t* pair_indices = indices.flat<int32_t>().data();
  TF_RETURN_IF_ERROR(LaunchWithScratch(context, [&](void* scratch, size_t* bytes, cudaStream_t stream) {
    return cuda::SparseBatchedDecode<typename FormatOf<T>::type>(AsBits(values.flat<T>().data()), pair_indices, n,
                                                                 dense->NumElements(), MutableBits<T>(dense),
                                                                 first_bad, scratch, bytes, stream);
  }));
  cudaStream_t stream;
  TF_RETURN_IF_ERROR(GetStream(context, &stream));
  // The one wait: is any index out of range?
  int64_t bad = 0;
  TF_RETURN_IF_ERROR(
      CudaStatus(context, cudaMemcpyAsync(&bad, first_bad, sizeof(bad), cudaMemcpyDeviceToHost, stream)));
  TF_RETURN_IF_ERROR(CudaStatus(context, cudaStreamSynchronize(stream)));
  *bad_position = -1;
  if (bad < n) {
    *bad_position = bad;
    TF_RETURN_IF_ERROR(CudaStatus(
        context, cudaMemcpyAsync(bad_index, pair_indices + bad, sizeof(*bad_index), cudaMemcpyDeviceToHost, stream)));
    TF_RETURN_IF_ERROR(CudaStatus(context, cudaStreamSynchronize(stream)));
  }
  return ::tensorflow::OkStatus();
}

Status ZeroAtLauncher<GpuDevice>::operator()(OpKernelContext* context, const Tensor& indices, int64_t offset,
                                            const Tensor* source, Tensor* data) const {
  cudaStream_t stream;
  TF_RETURN_IF_ERROR(GetStream(context, &stream));
  float* out = data->flat<float>().data();
  if (source != nullptr) {
    TF_RETURN_IF_ERROR(CudaStatus(context, cudaMemcpyAsync(out, source->flat<float>().data(), source->TotalBytes(),
                                                           cudaMemcpyDeviceToDevice, stream)));
  }
  return CudaStatus(context, cuda::ZeroAt(out, data->NumElements(), indices.flat<int32_t>().data(),
                                          indices.NumElements(), offset, stream));
}

Status MomentumAccumulateLauncher<GpuDevice>::operator()(OpKernelContext* context, const AccumulateTensors& t,
                                                        float mu) const {
  cudaStream_t stream;
  TF_RETURN_IF_ERROR(GetStream(context, &stream));
  return CudaStatus(context, cuda::MomentumAccumulate(t.grad, t.moments[0], t.residual, t.size, mu, t.new_moments[0],
                                                      t.accumulated, stream));
}

Status AdamAccumulateLauncher<GpuDevice>::operator()(OpKernelContext* context, const AccumulateTensors& t,
                                                    const AdamCoefficients& constants, const Tensor& m_correction,
                                                    const Tensor& v_correction) const {
  cudaStream_t stream;
  TF_RETURN_IF_ERROR(GetStream(context, &stream));
  return CudaStatus(context, cuda::AdamAccumulate(t.grad, t.moments[0], t.moments[1], t.residual, t.size, constants,
                                                  m_correction.scalar<float>().data(),
                                                  v_correction.scalar<float>().data(), t.new_moments[0],
                                                  t.new_moments[1], t.accumulated, stream));
}

Status HashPartitionLauncher<GpuDevice>::Count(OpKernelContext* context, const Tensor& indices, int32_t num_parts,
                                               int32_t* counts, int64_t* bad_position, int32_t* bad_index) const {
  cudaStream_t stream;
  TF_RETURN_IF_ERROR(GetStream(context, &stream));
  const int64_t n = indices.NumElements();
  const int64_t chunks = cuda::PartitionChunks(n);
  std::fill(counts, counts + num_parts, 0);
  *bad_position = -1;
  if (chunks * num_parts > kMaxIndexable) {
    return errors::InvalidArgument("num_parts = ", num_parts, " with ", n, " pairs needs ", chunks * num_parts,
                                   " per-chunk counters on the GPU, more than 2^31 - 1");
  }
  TF_RETURN_IF_ERROR(HostScratch("the per-chunk cursors", [&] { cursors_.assign(chunks * num_parts, 0); }));
  if (chunks == 0) return ::tensorflow::OkStatus();
  Tensor chunk_counts, first_bad;
  TF_RETURN_IF_ERROR(context->allocate_temp(::tensorflow::DT_INT32, {chunks * num_parts}, &chunk_counts));
  TF_RETURN_IF_ERROR(context->allocate_temp(::tensorflow::DT_INT64, {chunks}, &first_bad));
  TF_RETURN_IF_ERROR(CudaStatus(context, cuda::HashPartitionCount(indices.flat<int32_t>().data(), n, num_parts,
                                                                  chunk_counts.flat<int32_t>().data(),
                                                                  first_bad.flat<int64_t>().data(), stream)));
  std::vector<int32_t> host_counts;
  std::vector<int64_t> host_bad;
  TF_RETURN_IF_ERROR(HostScratch("the per-chunk counts", [&] {
    host_counts.resize(chunks * num_parts);
    host_bad.resize(chunks);
  }));
  TF_RETURN_IF_ERROR(CudaStatus(context, cudaMemcpyAsync(host_counts.data(), chunk_counts.flat<int32_t>().data(),
                                                         host_counts.size() * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                                         stream)));
  TF_RETURN_IF_ERROR(CudaStatus(context, cudaMemcpyAsync(host_bad.data(), first_bad.flat<int64_t>().data(),
                                                         host_bad.size() * sizeof(int64_t), cudaMemcpyDeviceToHost,
                                                         stream)));
  TF_RETURN_IF_ERROR(CudaStatus(context, cudaStreamSynchronize(stream)));
  for (int64_t c = 0; c < chunks; ++c) {
    if (host_bad[c] < n) {
      *bad_position = host_bad[c];
      TF_RETURN_IF_ERROR(CudaStatus(context, cudaMemcpyAsync(bad_index, indices.flat<int32_t>().data() + host_bad[c],
                                                             sizeof(*bad_index), cudaMemcpyDeviceToHost, stream)));
      return CudaStatus(context, cudaStreamSynchronize(stream));
    }
  }
  // Cursors: the exclusive sum in (owner, chunk) order; the owners' totals are the splits.
  int64_t total = 0;
  for (int32_t p = 0; p < num_parts; ++p) {
    for (int64_t c = 0; c < chunks; ++c) {
      cursors_[c * num_parts + p] = total;
      total += host_counts[c * num_parts + p];
      counts[p] += host_counts[c * num_parts + p];
    }
  }
  return ::tensorflow::OkStatus();
}

Status HashPartitionLauncher<GpuDevice>::Write(OpKernelContext* context, const Tensor& values, const Tensor& indices,
                                               int32_t num_parts, const int32_t* counts, Tensor* rows) const {
  (void)counts;
  if (cursors_.empty()) return ::tensorflow::OkStatus();
  cudaStream_t stream;
  TF_RETURN_IF_ERROR(GetStream(context, &stream));
  Tensor cursors;
  TF_RETURN_IF_ERROR(context->allocate_temp(::tensorflow::DT_INT64, {static_cast<int64_t>(cursors_.size())}, &cursors));
  // From pageable memory: the copy has read cursors_ when it returns.
  TF_RETURN_IF_ERROR(CudaStatus(context, cudaMemcpyAsync(cursors.flat<int64_t>().data(), cursors_.data(),
                                                         cursors_.size() * sizeof(int64_t), cudaMemcpyHostToDevice,
                                                         stream)));
  return CudaStatus(context, cuda::HashPartitionWrite(values.flat<float>().data(), indices.flat<int32_t>().data(),
                                                      indices.NumElements(), num_parts, cursors.flat<int64_t>().data(),
                                                      rows->flat<int32_t>().data(), stream));
}

Status SumPairsLauncher<GpuDevice>::operator()(OpKernelContext* context, const Tensor& rows, int64_t max_pairs,
                                               int64_t* bad_row, int32_t* bad_index) const {
  const int64_t n = rows.dim_size(0);
  *bad_row = -1;
  if (n > kMaxIndexable) {
    return errors::InvalidArgument("rows has ", n, " rows, more than 2^31 - 1 (the GPU kernel's limit)");
  }
  cudaStream_t stream;
  TF_RETURN_IF_ERROR(GetStream(context, &stream));
  const int32_t* in = rows.flat<int32_t>().data();
  Tensor sums, counts;
  TF_RETURN_IF_ERROR(context->allocate_temp(::tensorflow::DT_INT32, {2 * n}, &sums));
  TF_RETURN_IF_ERROR(context->allocate_temp(::tensorflow::DT_INT64, {2}, &counts));
  int32_t* all_sums = sums.flat<int32_t>().data();
  int64_t* first_negative = counts.flat<int64_t>().data();
  int64_t* distinct = first_negative + 1;
  TF_RETURN_IF_ERROR(LaunchWithScratch(context, [&](void* scratch, size_t* bytes, cudaStream_t launch_stream) {
    return cuda::SumPairsPerIndex(in, n, all_sums, first_negative, distinct, scratch, bytes, launch_stream);
  }));
  // The one wait: a negative index, and else the number of distinct indices (the output's shape).
  int64_t host_counts[2] = {0, 0};
  TF_RETURN_IF_ERROR(CudaStatus(
      context, cudaMemcpyAsync(host_counts, first_negative, sizeof(host_counts), cudaMemcpyDeviceToHost, stream)));
  TF_RETURN_IF_ERROR(CudaStatus(context, cudaStreamSynchronize(stream)));
  if (host_counts[0] < n) {
    *bad_row = host_counts[0];
    TF_RETURN_IF_ERROR(CudaStatus(
        context, cudaMemcpyAsync(bad_index, in + 2 * *bad_row, sizeof(*bad_index), cudaMemcpyDeviceToHost, stream)));
    return CudaStatus(context, cudaStreamSynchronize(stream));
  }
  const int64_t num_distinct = host_counts[1];
  if (num_distinct < 0 || num_distinct > n) {
    return errors::Internal(context->op_kernel().type_string(), " on GPU: counted ", num_distinct,
                            " distinct indices among ", n, " rows");
  }
  const int64_t kept = max_pairs < 0 ? num_distinct : std::min(num_distinct, max_pairs);
  Tensor* out = nullptr;
  TF_RETURN_IF_ERROR(context->allocate_output(0, {kept, 2}, &out));
  if (kept == 0) return ::tensorflow::OkStatus();
  int32_t* kept_rows = out->flat<int32_t>().data();
  return LaunchWithScratch(context, [&](void* scratch, size_t* bytes, cudaStream_t launch_stream) {
    return cuda::SumPairsKeep(all_sums, num_distinct, max_pairs < 0 ? -1 : max_pairs, kept_rows, scratch, bytes,
                              launch_stream);
  });
}

Status IntQuantizeLauncher<GpuDevice>::operator()(OpKernelContext* context, const Tensor& grad, const Tensor& scale,
                                                 const Tensor& seed, int bits, int32_t levels, Tensor* lanes) const {
  cudaStream_t stream;
  TF_RETURN_IF_ERROR(GetStream(context, &stream));
  return CudaStatus(context, cuda::IntQuantize(grad.flat<float>().data(), grad.NumElements(),
                                               scale.scalar<float>().data(), seed.scalar<int64_t>().data(), bits,
                                               levels, lanes->flat<int32_t>().data(), stream));
}

Status IntDequantizeLauncher<GpuDevice>::operator()(OpKernelContext* context, const Tensor& lanes, const Tensor& step,
                                                   int bits, Tensor* dense) const {
  cudaStream_t stream;
  TF_RETURN_IF_ERROR(GetStream(context, &stream));
  return CudaStatus(context, cuda::IntDequantize(lanes.flat<int32_t>().data(), dense->NumElements(),
                                                 step.scalar<float>().data(), bits, dense->flat<float>().data(),
                                                 stream));
}

#define TFCOMP_INSTANTIATE(T)                                 \
  template struct EstimateThresholdLauncher<GpuDevice, T>;   \
  template struct DragonnCompressLauncher<GpuDevice, T>;     \
  template struct DgcCompressLauncher<GpuDevice, T>;         \
  template struct TopkCompressLauncher<GpuDevice, T>;        \
  template struct SparseBatchedDecodeLauncher<GpuDevice, T>;
TFCOMP_INSTANTIATE(float)
TFCOMP_INSTANTIATE(Eigen::half)
TFCOMP_INSTANTIATE(Eigen::bfloat16)
#undef TFCOMP_INSTANTIATE

}  // namespace tfcomp
