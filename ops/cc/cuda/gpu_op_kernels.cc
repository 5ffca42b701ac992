// GPU (DEVICE_GPU) kernels of the tfcomp ops, compiled only in the CUDA build (--config=cuda).
//
// Each kernel checks its arguments as the CPU kernel does (same messages), allocates its outputs and
// its scratch (allocate_temp, sized by the launcher's query), and enqueues the framework-free CUDA
// code of tfcomp_cuda.h on the op's stream; a CUDA error becomes an Internal error naming the op.
// Differences from the CPU kernels, all forced by keeping the encodes free of host synchronisation:
//   * threshold and seed are read on the device, so a non-finite threshold is not rejected: NaN
//     selects every element, +Inf only the non-finite ones;
//   * estimate_threshold reads `ratio` from host memory (HostMemory), to check it and derive k;
//   * sparse_batched_decode waits for its stream once, after the scatter, to report an index out of
//     range as InvalidArgument (the output is then not produced).
// First: included after TensorFlow's logging, stream_executor's absl/log/check.h redefines CHECK.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "ops/cc/cuda/tfcomp_cuda.h"
#include "ops/cc/kernels/kernel_util.h"
#include "ops/cc/lib/hashing.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/platform/stream_executor.h"

namespace tfcomp {
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
namespace errors = ::tensorflow::errors;

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

template <typename T>
BitsOf<T>* MutableBits(Tensor* tensor) {
  return reinterpret_cast<BitsOf<T>*>(tensor->flat<T>().data());
}

// grad: any shape, T; ratio: float32 scalar (host); seed: int64 scalar -> threshold: float32 scalar.
template <typename T>
class EstimateThresholdGpuOp : public OpKernel {
 public:
  explicit EstimateThresholdGpuOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("num_samples", &num_samples_));
  }

  void Compute(OpKernelContext* context) override {
    using Format = typename FormatOf<T>::type;
    const Tensor& grad = context->input(0);
    float ratio;
    OP_REQUIRES_OK(context, CheckEstimateArgs(grad, context->input(1), context->input(2), &ratio));
    const int64_t size = grad.NumElements();
    const int64_t n = std::min<int64_t>(num_samples_, size);
    OP_REQUIRES(context, n <= std::numeric_limits<int32_t>::max(),
                errors::InvalidArgument("num_samples must be < 2^31 on GPU, got ", num_samples_));
    Tensor* threshold = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, {}, &threshold));
    OP_REQUIRES_OK(context, LaunchWithScratch(context, [&](void* scratch, size_t* bytes, cudaStream_t stream) {
                     return cuda::EstimateThreshold<Format>(AsBits(grad.flat<T>().data()), size, n,
                                                            SampleRank(ratio, n),
                                                            context->input(2).scalar<int64_t>().data(),
                                                            threshold->scalar<float>().data(), scratch, bytes, stream);
                   }));
  }

 private:
  int64_t num_samples_;
};

// grad: any shape, T; threshold: float32 scalar; seed: int64 scalar -> values [num_slots] T,
// indices [num_slots] int32.
template <typename T>
class DragonnCompressGpuOp : public OpKernel {
 public:
  explicit DragonnCompressGpuOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("num_slots", &num_slots_));
    OP_REQUIRES(context, num_slots_ <= std::numeric_limits<int32_t>::max(),
                errors::InvalidArgument("num_slots must be < 2^31, got ", num_slots_));
  }

  void Compute(OpKernelContext* context) override {
    using Format = typename FormatOf<T>::type;
    const Tensor& grad = context->input(0);
    OP_REQUIRES_OK(context, CheckScalar(context->input(1), "threshold"));
    OP_REQUIRES_OK(context, CheckScalar(context->input(2), "seed"));
    OP_REQUIRES_OK(context, CheckIndexable(grad));
    Tensor* values = nullptr;
    Tensor* indices = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, {num_slots_}, &values));
    OP_REQUIRES_OK(context, context->allocate_output(1, {num_slots_}, &indices));
    OP_REQUIRES_OK(context, LaunchWithScratch(context, [&](void* scratch, size_t* bytes, cudaStream_t stream) {
                     return cuda::DragonnCompress<Format>(
                         AsBits(grad.flat<T>().data()), grad.NumElements(), context->input(1).scalar<float>().data(),
                         context->input(2).scalar<int64_t>().data(), num_slots_, MutableBits<T>(values),
                         indices->flat<int32_t>().data(), scratch, bytes, stream);
                   }));
  }

 private:
  int64_t num_slots_;
};

// grad: any shape, T; threshold: float32 scalar -> values [max_out] T, indices [max_out] int32.
template <typename T>
class DgcCompressGpuOp : public OpKernel {
 public:
  explicit DgcCompressGpuOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("max_out", &max_out_));
    OP_REQUIRES(context, max_out_ <= std::numeric_limits<int32_t>::max(),
                errors::InvalidArgument("max_out must be < 2^31 on GPU, got ", max_out_));
  }

  void Compute(OpKernelContext* context) override {
    using Format = typename FormatOf<T>::type;
    const Tensor& grad = context->input(0);
    OP_REQUIRES_OK(context, CheckScalar(context->input(1), "threshold"));
    OP_REQUIRES_OK(context, CheckIndexable(grad));
    Tensor* values = nullptr;
    Tensor* indices = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, {max_out_}, &values));
    OP_REQUIRES_OK(context, context->allocate_output(1, {max_out_}, &indices));
    OP_REQUIRES_OK(context, LaunchWithScratch(context, [&](void* scratch, size_t* bytes, cudaStream_t stream) {
                     return cuda::DgcCompress<Format>(
                         AsBits(grad.flat<T>().data()), grad.NumElements(), context->input(1).scalar<float>().data(),
                         max_out_, MutableBits<T>(values), indices->flat<int32_t>().data(), scratch, bytes, stream);
                   }));
  }

 private:
  int64_t max_out_;
};

// grad: any shape with >= k elements, T -> values [k] T, indices [k] int32 (increasing).
template <typename T>
class TopkCompressGpuOp : public OpKernel {
 public:
  explicit TopkCompressGpuOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("k", &k_));
  }

  void Compute(OpKernelContext* context) override {
    using Format = typename FormatOf<T>::type;
    const Tensor& grad = context->input(0);
    OP_REQUIRES_OK(context, CheckIndexable(grad));
    const int64_t size = grad.NumElements();
    OP_REQUIRES_OK(context, CheckTopkK(grad, k_));
    Tensor* values = nullptr;
    Tensor* indices = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, {k_}, &values));
    OP_REQUIRES_OK(context, context->allocate_output(1, {k_}, &indices));
    OP_REQUIRES_OK(context, LaunchWithScratch(context, [&](void* scratch, size_t* bytes, cudaStream_t stream) {
                     return cuda::TopkCompress<Format>(AsBits(grad.flat<T>().data()), size, k_, MutableBits<T>(values),
                                                       indices->flat<int32_t>().data(), scratch, bytes, stream);
                   }));
  }

 private:
  int64_t k_;
};

// values [n] T, indices [n] int32 -> dense [size] T.
template <typename T>
class SparseBatchedDecodeGpuOp : public OpKernel {
 public:
  explicit SparseBatchedDecodeGpuOp(OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("size", &size_));
  }

  void Compute(OpKernelContext* context) override {
    using Format = typename FormatOf<T>::type;
    const Tensor& values = context->input(0);
    const Tensor& indices = context->input(1);
    OP_REQUIRES_OK(context, CheckDecodePairs(values, indices));
    const int64_t n = values.NumElements();
    cudaStream_t stream;
    OP_REQUIRES_OK(context, GetStream(context, &stream));
    Tensor* dense = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, {size_}, &dense));
    Tensor first_bad_tensor;
    OP_REQUIRES_OK(context, context->allocate_temp(::tensorflow::DT_INT64, {1}, &first_bad_tensor));
    int64_t* first_bad = first_bad_tensor.flat<int64_t>().data();
    const int32_t* pair_indices = indices.flat<int32_t>().data();
    OP_REQUIRES_OK(context, CudaStatus(context, cuda::SparseBatchedDecode<Format>(
                                                    AsBits(values.flat<T>().data()), pair_indices, n, size_,
                                                    MutableBits<T>(dense), first_bad, stream)));
    // The one wait: is any index out of range? (Then the op fails and `dense` is discarded.)
    int64_t bad = 0;
    OP_REQUIRES_OK(context,
                   CudaStatus(context, cudaMemcpyAsync(&bad, first_bad, sizeof(bad), cudaMemcpyDeviceToHost, stream)));
    OP_REQUIRES_OK(context, CudaStatus(context, cudaStreamSynchronize(stream)));
    if (bad < n) {
      int32_t bad_index = 0;
      OP_REQUIRES_OK(context, CudaStatus(context, cudaMemcpyAsync(&bad_index, pair_indices + bad, sizeof(bad_index),
                                                                  cudaMemcpyDeviceToHost, stream)));
      OP_REQUIRES_OK(context, CudaStatus(context, cudaStreamSynchronize(stream)));
      context->SetStatus(BadDecodeIndex(bad, bad_index, size_));
    }
  }

 private:
  int64_t size_;
};

#define REGISTER_GPU(T)                                                                                               \
  REGISTER_KERNEL_BUILDER(                                                                                            \
      Name("Tfcomp>EstimateThreshold").Device(::tensorflow::DEVICE_GPU).TypeConstraint<T>("T").HostMemory("ratio"),   \
      EstimateThresholdGpuOp<T>);                                                                                     \
  REGISTER_KERNEL_BUILDER(Name("Tfcomp>DragonnCompress").Device(::tensorflow::DEVICE_GPU).TypeConstraint<T>("T"),     \
                          DragonnCompressGpuOp<T>);                                                                   \
  REGISTER_KERNEL_BUILDER(Name("Tfcomp>DgcCompress").Device(::tensorflow::DEVICE_GPU).TypeConstraint<T>("T"),         \
                          DgcCompressGpuOp<T>);                                                                       \
  REGISTER_KERNEL_BUILDER(Name("Tfcomp>TopkCompress").Device(::tensorflow::DEVICE_GPU).TypeConstraint<T>("T"),        \
                          TopkCompressGpuOp<T>);                                                                      \
  REGISTER_KERNEL_BUILDER(Name("Tfcomp>SparseBatchedDecode").Device(::tensorflow::DEVICE_GPU).TypeConstraint<T>("T"), \
                          SparseBatchedDecodeGpuOp<T>)
REGISTER_GPU(float);
REGISTER_GPU(Eigen::half);
REGISTER_GPU(Eigen::bfloat16);
#undef REGISTER_GPU

}  // namespace
}  // namespace tfcomp
