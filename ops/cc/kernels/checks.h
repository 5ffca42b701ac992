// The argument checks of the tfcomp ops, in one place: the OpKernel templates (ops/cc/kernels/) run
// them for every device, and the shape functions (ops/cc/ops/tfcomp_ops.cc) run the attribute checks.
// Every message names the argument and prints its value or shape.
#ifndef TFCOMP_OPS_CC_KERNELS_CHECKS_H_
#define TFCOMP_OPS_CC_KERNELS_CHECKS_H_

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "ops/cc/lib/magnitude.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/lib/core/errors.h"
#include "tensorflow/core/platform/status.h"

namespace tfcomp {

// Indices are int32: no gradient, payload or dense output may be longer than this.
constexpr int64_t kMaxIndexable = std::numeric_limits<int32_t>::max();

// An integer attribute that is a length (num_slots, max_out, k, size) must be at most kMaxIndexable.
// (Its lower bound is the op definition's `int >= ...`.)
inline ::tensorflow::Status CheckLengthAttr(const char* name, int64_t value) {
  if (value > kMaxIndexable) {
    return ::tensorflow::errors::InvalidArgument(name, " must be at most 2147483647 (2^31 - 1: indices are int32), got ",
                                                 value);
  }
  return ::tensorflow::OkStatus();
}

// Fails unless `tensor` is a scalar; `name` is the op argument it came from.
inline ::tensorflow::Status CheckScalar(const ::tensorflow::Tensor& tensor, const char* name) {
  if (!::tensorflow::TensorShapeUtils::IsScalar(tensor.shape())) {
    return ::tensorflow::errors::InvalidArgument(name, " must be a scalar, got shape ",
                                                 tensor.shape().DebugString());
  }
  return ::tensorflow::OkStatus();
}

// The threshold must be a float32 scalar, and finite. Its value can be checked only where it is in
// host memory (value_on_host): the GPU kernels keep it on the device, so that an encode never waits
// for the host; there a NaN threshold selects every element and +Inf only the non-finite ones.
inline ::tensorflow::Status CheckThreshold(const ::tensorflow::Tensor& threshold, bool value_on_host) {
  TF_RETURN_IF_ERROR(CheckScalar(threshold, "threshold"));
  if (value_on_host && !std::isfinite(threshold.scalar<float>()())) {
    return ::tensorflow::errors::InvalidArgument("threshold must be finite, got ", threshold.scalar<float>()());
  }
  return ::tensorflow::OkStatus();
}

// The gradient of estimate_threshold and dragonn_compress: a list of tensors (`grads`, the op
// argument grad, read as their concatenation) of at most 2^31 - 1 elements in all, and the
// optional `addends` (the op argument addend): none, or one per grad tensor of its shape, float32
// only.
inline ::tensorflow::Status CheckGradParts(const ::tensorflow::OpInputList& grads,
                                           const ::tensorflow::OpInputList& addends) {
  int64_t total = 0;
  for (int i = 0; i < grads.size(); ++i) total += grads[i].NumElements();
  if (total > kMaxIndexable) {
    return ::tensorflow::errors::InvalidArgument("grad has ", total, " elements in ", grads.size(),
                                                 " tensors; at most 2^31 - 1 are supported because indices are int32");
  }
  if (addends.size() != 0 && addends.size() != grads.size()) {
    return ::tensorflow::errors::InvalidArgument("addend must hold no tensor or one per grad tensor (", grads.size(),
                                                 "), got ", addends.size());
  }
  for (int i = 0; i < addends.size(); ++i) {
    if (addends[i].dtype() != ::tensorflow::DT_FLOAT || grads[i].dtype() != ::tensorflow::DT_FLOAT) {
      return ::tensorflow::errors::InvalidArgument("addend is supported for float32 only, got ",
                                                   ::tensorflow::DataTypeString(grads[i].dtype()), " grad");
    }
    if (addends[i].shape() != grads[i].shape()) {
      return ::tensorflow::errors::InvalidArgument("addend[", i, "] must have the shape of grad[", i, "], ",
                                                   grads[i].shape().DebugString(), ", got ",
                                                   addends[i].shape().DebugString());
    }
  }
  return ::tensorflow::OkStatus();
}

// Indices are int32: a gradient may hold at most 2^31 - 1 elements.
inline ::tensorflow::Status CheckIndexable(const ::tensorflow::Tensor& grad) {
  if (grad.NumElements() > kMaxIndexable) {
    return ::tensorflow::errors::InvalidArgument(
        "grad has ", grad.NumElements(), " elements (shape ", grad.shape().DebugString(),
        "); at most 2^31 - 1 are supported because indices are int32");
  }
  return ::tensorflow::OkStatus();
}

// estimate_threshold: ratio a float32 scalar in (0, 1] (host memory on every device; stored in
// *ratio), seed a scalar, the gradient (`grads`, CheckGradParts) not empty.
inline ::tensorflow::Status CheckEstimateArgs(const ::tensorflow::OpInputList& grads,
                                              const ::tensorflow::Tensor& ratio_tensor,
                                              const ::tensorflow::Tensor& seed_tensor, float* ratio) {
  TF_RETURN_IF_ERROR(CheckScalar(ratio_tensor, "ratio"));
  TF_RETURN_IF_ERROR(CheckScalar(seed_tensor, "seed"));
  *ratio = ratio_tensor.scalar<float>()();
  // Compared on the bits (positive, not zero, at most 1.0f): a float compare would take a denormal
  // ratio for 0, since TensorFlow runs CPU kernels with denormals flushed to zero.
  const uint32_t bits = FloatToBits(*ratio);
  if (bits == 0 || bits > 0x3F800000u) {
    return ::tensorflow::errors::InvalidArgument("ratio must be in (0, 1], got ", *ratio);
  }
  std::string shapes;
  for (int i = 0; i < grads.size(); ++i) {
    if (grads[i].NumElements() > 0) return ::tensorflow::OkStatus();
    shapes += (i == 0 ? "" : ", ") + grads[i].shape().DebugString();
  }
  return ::tensorflow::errors::InvalidArgument("grad must not be empty, got shape", grads.size() == 1 ? " " : "s ",
                                               shapes);
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

// hash_partition's num_parts, the number of owners (ranks): at most 2^20. splits holds one int32 per
// owner, so that a larger num_parts would size the op's memory by an attribute, not by its pairs
// (2^26 took 772 MiB for 3 pairs).
constexpr int64_t kMaxNumParts = int64_t{1} << 20;

inline ::tensorflow::Status CheckNumParts(int64_t num_parts) {
  if (num_parts < 1 || num_parts > kMaxNumParts) {
    return ::tensorflow::errors::InvalidArgument(
        "num_parts must be in [1, 1048576] (2^20 owners: splits holds one int32 per owner), got ", num_parts);
  }
  return ::tensorflow::OkStatus();
}

// hash_partition's pairs: splits and rows count them in int32, so at most 2^31 - 1.
inline ::tensorflow::Status CheckPartitionPairs(const ::tensorflow::Tensor& indices) {
  if (indices.NumElements() > kMaxIndexable) {
    return ::tensorflow::errors::InvalidArgument("indices has ", indices.NumElements(),
                                                 " pairs; at most 2^31 - 1 are supported because splits are int32");
  }
  return ::tensorflow::OkStatus();
}

// sum_pairs's rows: int32 [n, 2], (index, float32 bits) per row.
inline ::tensorflow::Status CheckPairRows(const ::tensorflow::Tensor& rows) {
  if (rows.dims() != 2 || rows.dim_size(1) != 2) {
    return ::tensorflow::errors::InvalidArgument("rows must have shape [n, 2], got shape ", rows.shape().DebugString());
  }
  return ::tensorflow::OkStatus();
}

// sum_pairs's max_pairs: -1 (keep every sum) or a length.
inline ::tensorflow::Status CheckMaxPairs(int64_t max_pairs) {
  if (max_pairs < -1) {
    return ::tensorflow::errors::InvalidArgument("max_pairs must be -1 (keep every sum) or >= 0, got ", max_pairs);
  }
  return CheckLengthAttr("max_pairs", max_pairs);
}

// sparse_batched_decode: pair `position` holds `index`, outside [-1, size).
inline ::tensorflow::Status BadDecodeIndex(int64_t position, int64_t index, int64_t size) {
  return ::tensorflow::errors::InvalidArgument("indices[", position, "] = ", index, " is out of range for size ", size,
                                               " (valid: -1 to ", size - 1, ")");
}

}  // namespace tfcomp

#endif  // TFCOMP_OPS_CC_KERNELS_CHECKS_H_
