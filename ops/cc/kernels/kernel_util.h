// Helpers shared by the CPU op kernels: dtype formats, argument checks and thread sharding.
#ifndef TFCOMP_OPS_CC_KERNELS_KERNEL_UTIL_H_
#define TFCOMP_OPS_CC_KERNELS_KERNEL_UTIL_H_

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "ops/cc/lib/magnitude.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/lib/core/errors.h"

namespace tfcomp {

template <typename T>
struct FormatOf;
template <>
struct FormatOf<float> {
  using type = Float32Format;
};
template <>
struct FormatOf<Eigen::half> {
  using type = Float16Format;
};
template <>
struct FormatOf<Eigen::bfloat16> {
  using type = BFloat16Format;
};

template <typename T>
using BitsOf = typename FormatOf<T>::type::Bits;

template <typename T>
const BitsOf<T>* AsBits(const T* data) {
  static_assert(sizeof(T) == sizeof(BitsOf<T>), "dtype and bits differ in size");
  return reinterpret_cast<const BitsOf<T>*>(data);
}

// Fails unless `tensor` is a scalar; `name` is the op argument it came from.
inline ::tensorflow::Status CheckScalar(const ::tensorflow::Tensor& tensor, const char* name) {
  if (!::tensorflow::TensorShapeUtils::IsScalar(tensor.shape())) {
    return ::tensorflow::errors::InvalidArgument(name, " must be a scalar, got shape ",
                                                 tensor.shape().DebugString());
  }
  return ::tensorflow::OkStatus();
}

// Reads a finite float32 scalar threshold.
inline ::tensorflow::Status ReadThreshold(const ::tensorflow::Tensor& tensor, float* threshold) {
  TF_RETURN_IF_ERROR(CheckScalar(tensor, "threshold"));
  *threshold = tensor.scalar<float>()();
  if (!std::isfinite(*threshold)) {
    return ::tensorflow::errors::InvalidArgument("threshold must be finite, got ", *threshold);
  }
  return ::tensorflow::OkStatus();
}

// Indices are int32: a gradient may hold at most 2^31 - 1 elements.
inline ::tensorflow::Status CheckIndexable(const ::tensorflow::Tensor& grad) {
  if (grad.NumElements() > std::numeric_limits<int32_t>::max()) {
    return ::tensorflow::errors::InvalidArgument(
        "grad has ", grad.NumElements(), " elements (shape ", grad.shape().DebugString(),
        "); at most 2^31 - 1 are supported because indices are int32");
  }
  return ::tensorflow::OkStatus();
}

// estimate_threshold: grad non-empty, ratio a float32 scalar in (0, 1] (stored in *ratio), seed a scalar.
inline ::tensorflow::Status CheckEstimateArgs(const ::tensorflow::Tensor& grad,
                                              const ::tensorflow::Tensor& ratio_tensor,
                                              const ::tensorflow::Tensor& seed_tensor, float* ratio) {
  TF_RETURN_IF_ERROR(CheckScalar(ratio_tensor, "ratio"));
  TF_RETURN_IF_ERROR(CheckScalar(seed_tensor, "seed"));
  *ratio = ratio_tensor.scalar<float>()();
  if (!(*ratio > 0.0f && *ratio <= 1.0f)) {
    return ::tensorflow::errors::InvalidArgument("ratio must be in (0, 1], got ", *ratio);
  }
  if (grad.NumElements() == 0) {
    return ::tensorflow::errors::InvalidArgument("grad must not be empty, got shape ", grad.shape().DebugString());
  }
  return ::tensorflow::OkStatus();
}

// topk_compress: k must not exceed the number of elements of grad.
inline ::tensorflow::Status CheckTopkK(const ::tensorflow::Tensor& grad, int64_t k) {
  if (k > grad.NumElements()) {
    return ::tensorflow::errors::InvalidArgument("k must be <= the number of elements of grad (", grad.NumElements(),
                                                 " for shape ", grad.shape().DebugString(), "), got ", k);
  }
  return ::tensorflow::OkStatus();
}

// sparse_batched_decode: values and indices must be vectors of the same length.
inline ::tensorflow::Status CheckDecodePairs(const ::tensorflow::Tensor& values, const ::tensorflow::Tensor& indices) {
  if (!::tensorflow::TensorShapeUtils::IsVector(values.shape())) {
    return ::tensorflow::errors::InvalidArgument("values must be a vector, got shape ", values.shape().DebugString());
  }
  if (!::tensorflow::TensorShapeUtils::IsVector(indices.shape())) {
    return ::tensorflow::errors::InvalidArgument("indices must be a vector, got shape ", indices.shape().DebugString());
  }
  if (values.NumElements() != indices.NumElements()) {
    return ::tensorflow::errors::InvalidArgument("values and indices must have the same length, got values of shape ",
                                                 values.shape().DebugString(), " and indices of shape ",
                                                 indices.shape().DebugString());
  }
  return ::tensorflow::OkStatus();
}

// sparse_batched_decode: pair `position` holds `index`, outside [-1, size).
inline ::tensorflow::Status BadDecodeIndex(int64_t position, int64_t index, int64_t size) {
  return ::tensorflow::errors::InvalidArgument("indices[", position, "] = ", index, " is out of range for size ", size,
                                               " (valid: -1 to ", size - 1, ")");
}

// Runs work(first_block, end_block) over ceil(total / block_size) blocks of block_size elements
// on the CPU device's intra-op threads. Block boundaries depend only on total and block_size.
inline void ParallelForBlocks(::tensorflow::OpKernelContext* context, int64_t total, int64_t block_size,
                              int64_t cost_per_element,
                              const std::function<void(int64_t, int64_t)>& work) {
  const int64_t num_blocks = (total + block_size - 1) / block_size;
  if (num_blocks == 0) return;
  auto* pool = context->device()->tensorflow_cpu_worker_threads()->workers;
  pool->ParallelFor(num_blocks, block_size * cost_per_element, work);
}

// Runs collect(begin, end, &list) over [0, total) in blocks of block_size elements on the intra-op
// threads, each thread appending to the list of the shard of blocks it was given. Returns the lists
// in block order (some empty): their concatenation is what one thread scanning in order would append.
template <typename Item, typename Collect>
std::vector<std::vector<Item>> CollectInBlocks(::tensorflow::OpKernelContext* context, int64_t total,
                                               int64_t block_size, const Collect& collect) {
  std::vector<std::vector<Item>> lists((total + block_size - 1) / block_size);
  ParallelForBlocks(context, total, block_size, /*cost_per_element=*/1, [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) {
      collect(b * block_size, std::min(total, (b + 1) * block_size), &lists[first]);
    }
  });
  return lists;
}

// The number of threads ParallelForBlocks can use.
inline int NumCpuThreads(::tensorflow::OpKernelContext* context) {
  return context->device()->tensorflow_cpu_worker_threads()->num_threads;
}

}  // namespace tfcomp

#endif  // TFCOMP_OPS_CC_KERNELS_KERNEL_UTIL_H_
