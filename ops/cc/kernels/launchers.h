// The per-device launchers of the tfcomp ops (tensorflow/custom-op's functor pattern).
//
// Each op has one OpKernel class template on (Device, T), in ops/cc/kernels/<op>_kernels.cc. It reads
// the attributes, runs every argument check (ops/cc/kernels/checks.h), allocates the outputs and calls
// the op's launcher for its device, which only runs the math on arguments already checked:
//   * CpuDevice: the framework-free core of ops/cc/lib on the intra-op threads, a partial
//     specialization defined beside the OpKernel;
//   * GpuDevice: the framework-free CUDA code of ops/cc/cuda/tfcomp_cuda.h on the op's stream, declared
//     below and defined in ops/cc/cuda/gpu_launchers.cc, only in the CUDA build (TFCOMP_CUDA).
// T is float, Eigen::half or Eigen::bfloat16. Scalars that other ops produce (threshold, seed) reach a
// launcher as tensors: in host memory on the CPU, in device memory on the GPU, where reading them
// would make an encode wait for the host (kScalarsOnHost). A launcher returns an error only when the
// device fails (an allocation, a CUDA error).
#ifndef TFCOMP_OPS_CC_KERNELS_LAUNCHERS_H_
#define TFCOMP_OPS_CC_KERNELS_LAUNCHERS_H_

#include <cstdint>
#include <type_traits>
#include <vector>

#include "ops/cc/kernels/kernel_util.h"
#include "ops/cc/lib/accumulate.h"
#include "ops/cc/lib/parts.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/mutex.h"
#include "tensorflow/core/platform/status.h"
#include "tensorflow/core/platform/thread_annotations.h"

namespace tfcomp {

// Device tags of the launchers.
struct CpuDevice {};
struct GpuDevice {};

// Whether threshold and seed are in host memory on Device, so that the OpKernel can check their values.
template <typename Device>
constexpr bool kScalarsOnHost = std::is_same<Device, CpuDevice>::value;

// The parts of one gradient (ops/cc/lib/parts.h) of the dtype T, as the kernels read them.
template <typename T>
using Parts = std::vector<GradientPart<BitsOf<T>>>;

// estimate_threshold: threshold (float32 scalar) = the k-th largest finite |g| of the n samples of the
// gradient given by `parts` (total elements), drawn with seed (int64 scalar); 1 <= n <= total, k >= 1.
// Where a part has an addend, its g is grad + addend, element by element, never stored.
template <typename Device, typename T>
struct EstimateThresholdLauncher;

// dragonn_compress: values, indices [num_slots] = DRAGONN's slots of the elements of the gradient
// given by `parts` (total elements, indexed as their concatenation) with |g| >= threshold (float32
// scalar), hashed by seed (int64 scalar); where a part has an addend, of g = grad + addend, written
// to the part's sum in the same pass. `kept`: the op's DragonnScratch.
template <typename Device, typename T>
struct DragonnCompressLauncher;

// The scratch a DragonnCompressOp keeps from call to call. On a GPU a call leaves its slots zero, so
// the next call on the same stream skips zeroing them: one launch fewer (dragonn_compress at 2^27
// float32 on an H100: 0.177 against 0.180 ms, research/notebook.md). The CPU launcher does not use it.
struct DragonnScratch {
  ::tensorflow::mutex mu;
  ::tensorflow::Tensor buffer TF_GUARDED_BY(mu);
  // Whether the last call succeeded, leaving buffer's slots zero after its work on `stream`.
  bool slots_zero TF_GUARDED_BY(mu) = false;
  void* stream TF_GUARDED_BY(mu) = nullptr;
};

// dgc_compress: values, indices [max_out] = the first max_out elements of grad with |g| >= threshold,
// padded with -1 / 0.
template <typename Device, typename T>
struct DgcCompressLauncher;

// topk_compress: values, indices [k] = the k elements of grad of largest |g|, in index order; k <= size.
template <typename Device, typename T>
struct TopkCompressLauncher;

// sparse_batched_decode: dense [size] = the sum of the pairs (values[p], indices[p]), -1 skipped. The
// first pair whose index is outside [-1, size) is reported in *bad_position and *bad_index
// (*bad_position = -1 when there is none); dense is then undefined.
template <typename Device, typename T>
struct SparseBatchedDecodeLauncher;

// zero_at: data[i - offset] = 0 for every index i of indices (int32 [n]) in [offset, offset + size of
// data); with `source` (not null: data is a new buffer replacing a shared one), data is first a copy of it.
template <typename Device>
struct ZeroAtLauncher;

// int_quantize: lanes (int32 [ceil(size / (32 / bits))]) = the packed levels of grad (float32) for
// scale (float32 scalar) and seed (int64 scalar); bits and levels checked.
template <typename Device>
struct IntQuantizeLauncher;

// int_dequantize: dense (float32 [size]) = the signed fields of lanes times step (float32 scalar).
template <typename Device>
struct IntDequantizeLauncher;

// hash_partition: Count fills counts (num_parts int32, host memory) with the pairs of index >= 0 per
// owner (HashOwner), and *bad_position and *bad_index with the first index < -1 (position -1: none,
// counts then incomplete); Write then fills rows
// (int32 [sum of counts, 2]: index, value bits), owner by owner, stable within an owner, and leaves
// counts as they were (the CPU launcher's cursors while it writes).
template <typename Device>
struct HashPartitionLauncher;

// sum_pairs: allocates output 0 (int32 [m, 2]) and fills it with the distinct indices of rows
// (int32 [n, 2]: index, float32 bits; shape checked) and the bits of the sums of their values in row
// order, at most max_pairs of them (-1: all; SelectionKey chooses), in ascending index order. The
// first row whose index is negative is reported in *bad_row and *bad_index (*bad_row = -1 when there
// is none); nothing is allocated then.
template <typename Device>
struct SumPairsLauncher;

// momentum_accumulate and adam_accumulate: the tensors of one call, float32 [size] each, checked
// (moments: the momentum, or Adam's m and v); residual null where there is none, accumulated null
// where it is the new momentum itself (momentum correction, no residual).
struct AccumulateTensors {
  int64_t size = 0;
  const float* grad = nullptr;
  const float* moments[2] = {nullptr, nullptr};
  const float* residual = nullptr;
  float* new_moments[2] = {nullptr, nullptr};
  float* accumulated = nullptr;
};

// momentum_accumulate: MomentumAccumulateAt (ops/cc/lib/accumulate.h) for every element; size > 0.
template <typename Device>
struct MomentumAccumulateLauncher;

// adam_accumulate: AdamAccumulateAt for every element, the constants' corrections replaced by the
// float32 scalars m_correction and v_correction; size > 0.
template <typename Device>
struct AdamAccumulateLauncher;

#if TFCOMP_CUDA
template <typename T>
struct EstimateThresholdLauncher<GpuDevice, T> {
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext* context, const Parts<T>& parts, int64_t total,
                                  int64_t n, int64_t k, const ::tensorflow::Tensor& seed,
                                  ::tensorflow::Tensor* threshold) const;
};

template <typename T>
struct DragonnCompressLauncher<GpuDevice, T> {
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext* context, const Parts<T>& parts, int64_t total,
                                  const ::tensorflow::Tensor& threshold, const ::tensorflow::Tensor& seed,
                                  ::tensorflow::Tensor* values, ::tensorflow::Tensor* indices,
                                  DragonnScratch* kept) const;
};

template <typename T>
struct DgcCompressLauncher<GpuDevice, T> {
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext* context, const ::tensorflow::Tensor& grad,
                                  const ::tensorflow::Tensor& threshold, ::tensorflow::Tensor* values,
                                  ::tensorflow::Tensor* indices) const;
};

template <typename T>
struct TopkCompressLauncher<GpuDevice, T> {
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext* context, const ::tensorflow::Tensor& grad,
                                  ::tensorflow::Tensor* values, ::tensorflow::Tensor* indices) const;
};

template <typename T>
struct SparseBatchedDecodeLauncher<GpuDevice, T> {
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext* context, const ::tensorflow::Tensor& values,
                                  const ::tensorflow::Tensor& indices, ::tensorflow::Tensor* dense,
                                  int64_t* bad_position, int32_t* bad_index) const;
};

template <>
struct ZeroAtLauncher<GpuDevice> {
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext* context, const ::tensorflow::Tensor& indices,
                                  int64_t offset, const ::tensorflow::Tensor* source, ::tensorflow::Tensor* data) const;
};

// hash_partition on the GPU: Count waits for the device once (the counts decide the rows' shape) and
// keeps each chunk's cursors on the host for Write.
template <>
struct HashPartitionLauncher<GpuDevice> {
  ::tensorflow::Status Count(::tensorflow::OpKernelContext* context, const ::tensorflow::Tensor& indices,
                             int32_t num_parts, int32_t* counts, int64_t* bad_position, int32_t* bad_index) const;
  ::tensorflow::Status Write(::tensorflow::OpKernelContext* context, const ::tensorflow::Tensor& values,
                             const ::tensorflow::Tensor& indices, int32_t num_parts, const int32_t* counts,
                             ::tensorflow::Tensor* rows) const;

 private:
  mutable std::vector<int64_t> cursors_;  // [chunk * num_parts + owner], from Count
};

// sum_pairs on the GPU waits for the device once: the first negative row and the number of distinct
// indices (which decides the output's shape) are read back before the output is allocated.
template <>
struct SumPairsLauncher<GpuDevice> {
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext* context, const ::tensorflow::Tensor& rows,
                                  int64_t max_pairs, int64_t* bad_row, int32_t* bad_index) const;
};

template <>
struct MomentumAccumulateLauncher<GpuDevice> {
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext* context, const AccumulateTensors& tensors,
                                  float mu) const;
};

template <>
struct AdamAccumulateLauncher<GpuDevice> {
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext* context, const AccumulateTensors& tensors,
                                  const AdamCoefficients& constants, const ::tensorflow::Tensor& m_correction,
                                  const ::tensorflow::Tensor& v_correction) const;
};

template <>
struct IntQuantizeLauncher<GpuDevice> {
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext* context, const ::tensorflow::Tensor& grad,
                                  const ::tensorflow::Tensor& scale, const ::tensorflow::Tensor& seed, int bits,
                                  int32_t levels, ::tensorflow::Tensor* lanes) const;
};

template <>
struct IntDequantizeLauncher<GpuDevice> {
  ::tensorflow::Status operator()(::tensorflow::OpKernelContext* context, const ::tensorflow::Tensor& lanes,
                                  const ::tensorflow::Tensor& step, int bits, ::tensorflow::Tensor* dense) const;
};
#endif  // TFCOMP_CUDA

// Registers Kernel<CpuDevice, T> for DEVICE_CPU and, in the CUDA build, Kernel<GpuDevice, T> for
// DEVICE_GPU (its builder extended by gpu_builder_suffix, e.g. .HostMemory("ratio")), for T float32,
// float16 and bfloat16.
#define TFCOMP_REGISTER_ONE(op, Kernel, tf_device, DeviceTag, builder_suffix, T)                               \
  REGISTER_KERNEL_BUILDER(Name(op).Device(::tensorflow::tf_device).TypeConstraint<T>("T") builder_suffix, \
                          Kernel<DeviceTag, T>)
#define TFCOMP_REGISTER_DEVICE(op, Kernel, tf_device, DeviceTag, builder_suffix)     \
  TFCOMP_REGISTER_ONE(op, Kernel, tf_device, DeviceTag, builder_suffix, float);       \
  TFCOMP_REGISTER_ONE(op, Kernel, tf_device, DeviceTag, builder_suffix, Eigen::half); \
  TFCOMP_REGISTER_ONE(op, Kernel, tf_device, DeviceTag, builder_suffix, Eigen::bfloat16)
#if TFCOMP_CUDA
#define TFCOMP_REGISTER_KERNELS(op, Kernel, gpu_builder_suffix) \
  TFCOMP_REGISTER_DEVICE(op, Kernel, DEVICE_CPU, CpuDevice, );  \
  TFCOMP_REGISTER_DEVICE(op, Kernel, DEVICE_GPU, GpuDevice, gpu_builder_suffix)
#else
#define TFCOMP_REGISTER_KERNELS(op, Kernel, gpu_builder_suffix) TFCOMP_REGISTER_DEVICE(op, Kernel, DEVICE_CPU, CpuDevice, )
#endif

}  // namespace tfcomp

#endif  // TFCOMP_OPS_CC_KERNELS_LAUNCHERS_H_
