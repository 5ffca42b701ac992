// Helpers shared by the op kernels: dtype formats (every device), thread sharding (CPU launchers) and
// host scratch whose allocation failure is an error (every device).
#ifndef TFCOMP_OPS_CC_KERNELS_KERNEL_UTIL_H_
#define TFCOMP_OPS_CC_KERNELS_KERNEL_UTIL_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <new>
#include <string>
#include <vector>

#include "ops/cc/kernels/checks.h"
#include "ops/cc/lib/magnitude.h"
#include "ops/cc/lib/parts.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/lib/core/errors.h"
#include "tensorflow/core/platform/status.h"

namespace tfcomp {

// The error of a launcher whose host scratch `what` could not be allocated.
inline ::tensorflow::Status OutOfHostMemory(const char* what) {
  return ::tensorflow::errors::ResourceExhausted("out of host memory for ", what,
                                                 " (the inputs are too large for the memory this process may use)");
}

// Runs `allocate`, which sizes host scratch (std::vectors) of a launcher, and returns OK, or
// OutOfHostMemory(what) where host memory runs out (std::bad_alloc). Only tfcomp's own code may run
// inside: TensorFlow's is built without exceptions, so a std::bad_alloc thrown through it can leave
// its allocator locked (a later allocation then waits forever); its allocate_output and allocate_temp
// report a failure as a status instead.
template <typename Allocate>
::tensorflow::Status HostScratch(const char* what, const Allocate& allocate) {
  try {
    allocate();
  } catch (const std::bad_alloc&) {
    return OutOfHostMemory(what);
  }
  return ::tensorflow::OkStatus();
}

// `status` of allocating memory whose size the length attribute `attr` (of value `length`) decides: a
// failure becomes an error that names the attribute and its value.
inline ::tensorflow::Status NameLengthAttr(const ::tensorflow::Status& status, const char* attr, int64_t length) {
  if (status.ok()) return status;
  return ::tensorflow::Status(status.code(), std::string(attr) + " = " + std::to_string(length) +
                                                 " asks for more memory than this process can allocate: " +
                                                 std::string(status.message()));
}

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

// The elements of an output tensor of dtype T as their raw bits.
template <typename T>
BitsOf<T>* MutableBits(::tensorflow::Tensor* tensor) {
  return reinterpret_cast<BitsOf<T>*>(tensor->flat<T>().data());
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
// threads, each thread appending to the list of the shard of blocks it was given. Fills *lists with
// the lists in block order (some empty): their concatenation is what one thread scanning in order would
// append. Where a list cannot grow (std::bad_alloc on a pool thread, which nothing else would catch),
// the lists are dropped and the status is ResourceExhausted.
template <typename Item, typename Collect>
::tensorflow::Status CollectInBlocks(::tensorflow::OpKernelContext* context, int64_t total, int64_t block_size,
                                     const Collect& collect, std::vector<std::vector<Item>>* lists) {
  constexpr const char* kWhat = "the lists of selected elements";
  TF_RETURN_IF_ERROR(HostScratch(kWhat, [&] { lists->assign((total + block_size - 1) / block_size, {}); }));
  std::atomic<bool> out_of_memory{false};
  ParallelForBlocks(context, total, block_size, /*cost_per_element=*/1, [&](int64_t first, int64_t last) {
    const ::tensorflow::Status status = HostScratch(kWhat, [&] {
      for (int64_t b = first; b < last; ++b) {
        collect(b * block_size, std::min(total, (b + 1) * block_size), &(*lists)[first]);
      }
    });
    if (!status.ok()) {
      std::vector<Item>().swap((*lists)[first]);
      out_of_memory = true;
    }
  });
  if (!out_of_memory) return ::tensorflow::OkStatus();
  std::vector<std::vector<Item>>().swap(*lists);
  return OutOfHostMemory(kWhat);
}

// The op's `grad` input list and its `addend` list as the parts of one gradient (the grad tensors'
// concatenation; checked by CheckGradParts); with addends and a `sum_output` list name, that output
// list allocated, one tensor per part of its grad's shape, as the parts' sums. *total: the gradient's
// elements.
template <typename T>
::tensorflow::Status ReadGradientParts(::tensorflow::OpKernelContext* context, const char* sum_output,
                                       std::vector<GradientPart<BitsOf<T>>>* parts, int64_t* total) {
  ::tensorflow::OpInputList grads, addends;
  TF_RETURN_IF_ERROR(context->input_list("grad", &grads));
  TF_RETURN_IF_ERROR(context->input_list("addend", &addends));
  TF_RETURN_IF_ERROR(CheckGradParts(grads, addends));
  ::tensorflow::OpOutputList sums;
  if (sum_output != nullptr) TF_RETURN_IF_ERROR(context->output_list(sum_output, &sums));
  parts->clear();
  *total = 0;
  for (int i = 0; i < grads.size(); ++i) {
    GradientPart<BitsOf<T>> part{AsBits(grads[i].flat<T>().data()), nullptr, nullptr, *total, grads[i].NumElements()};
    if (addends.size() != 0) {
      part.addend = AsBits(addends[i].flat<T>().data());
      if (sum_output != nullptr) {
        ::tensorflow::Tensor* sum = nullptr;
        TF_RETURN_IF_ERROR(sums.allocate(i, grads[i].shape(), &sum));
        part.sum = MutableBits<T>(sum);
      }
    }
    parts->push_back(part);
    *total += part.size;
  }
  return ::tensorflow::OkStatus();
}

// The number of threads ParallelForBlocks can use.
inline int NumCpuThreads(::tensorflow::OpKernelContext* context) {
  return context->device()->tensorflow_cpu_worker_threads()->num_threads;
}

}  // namespace tfcomp

#endif  // TFCOMP_OPS_CC_KERNELS_KERNEL_UTIL_H_
