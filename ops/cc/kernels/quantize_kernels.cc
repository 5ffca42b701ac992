// Tfcomp>IntQuantize and Tfcomp>IntDequantize (IntQuant): the OpKernels (every device) and their
// CPU launchers.
#include <algorithm>

#include "ops/cc/kernels/checks.h"
#include "ops/cc/kernels/kernel_util.h"
#include "ops/cc/kernels/launchers.h"
#include "ops/cc/lib/hashing.h"
#include "ops/cc/lib/quantize.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tfcomp {

using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;

constexpr int64_t kLaneBlock = 1 << 14;

template <>
struct IntQuantizeLauncher<CpuDevice> {
  Status operator()(OpKernelContext* context, const Tensor& grad, const Tensor& scale, const Tensor& seed, int bits,
                    int32_t levels, Tensor* lanes) const {
    const int64_t size = grad.NumElements();
    const int64_t num_lanes = lanes->NumElements();
    const float* g = grad.flat<float>().data();
    const float scale_value = scale.scalar<float>()();
    const bool valid = IsValidScale(scale_value);
    const float per_level = valid ? static_cast<float>(levels) / scale_value : 0.0f;
    const uint64_t key = Mix64(static_cast<uint64_t>(seed.scalar<int64_t>()()));
    int32_t* out = lanes->flat<int32_t>().data();
    ParallelForBlocks(context, num_lanes, kLaneBlock, /*cost_per_element=*/10 * (32 / bits),
                      [&](int64_t first, int64_t last) {
                        for (int64_t lane = first * kLaneBlock; lane < std::min(num_lanes, last * kLaneBlock); ++lane) {
                          out[lane] = PackedLane(g, size, per_level, valid, levels, bits, key, lane);
                        }
                      });
    return ::tensorflow::OkStatus();
  }
};

template <>
struct IntDequantizeLauncher<CpuDevice> {
  Status operator()(OpKernelContext* context, const Tensor& lanes, const Tensor& step, int bits, Tensor* dense) const {
    const int64_t size = dense->NumElements();
    const int64_t fields = 32 / bits;
    const int64_t num_lanes = lanes.NumElements();
    const int32_t* in = lanes.flat<int32_t>().data();
    const float step_value = step.scalar<float>()();
    float* out = dense->flat<float>().data();
    ParallelForBlocks(context, num_lanes, kLaneBlock, /*cost_per_element=*/3 * fields, [&](int64_t first, int64_t last) {
      for (int64_t lane = first * kLaneBlock; lane < std::min(num_lanes, last * kLaneBlock); ++lane) {
        const int count = static_cast<int>(std::min(fields, size - lane * fields));
        UnpackLane(in[lane], bits, count, step_value, out + lane * fields);
      }
    });
    return ::tensorflow::OkStatus();
  }
};

namespace {

// Fails unless bits is 4, 8 or 16 and 1 <= levels <= 2^(bits-1) - 1.
Status CheckBitsAndLevels(int64_t bits, int64_t levels) {
  if (bits != 4 && bits != 8 && bits != 16) {
    return ::tensorflow::errors::InvalidArgument("bits must be 4, 8 or 16, got ", bits);
  }
  const int64_t most = (int64_t{1} << (bits - 1)) - 1;
  if (levels < 1 || levels > most) {
    return ::tensorflow::errors::InvalidArgument("levels must be in [1, ", most, "] for bits=", bits, ", got ", levels);
  }
  return ::tensorflow::OkStatus();
}

int64_t NumLanes(int64_t size, int64_t bits) { return (size + 32 / bits - 1) / (32 / bits); }

// grad: float32, any shape; scale: float32 scalar; seed: int64 scalar -> lanes: int32
// [ceil(size * bits / 32)].
template <typename Device>
class IntQuantizeOp : public ::tensorflow::OpKernel {
 public:
  explicit IntQuantizeOp(::tensorflow::OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("bits", &bits_));
    OP_REQUIRES_OK(context, context->GetAttr("levels", &levels_));
    OP_REQUIRES_OK(context, CheckBitsAndLevels(bits_, levels_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& grad = context->input(0);
    const Tensor& scale = context->input(1);
    const Tensor& seed = context->input(2);
    OP_REQUIRES_OK(context, CheckScalar(scale, "scale"));
    OP_REQUIRES_OK(context, CheckScalar(seed, "seed"));
    OP_REQUIRES_OK(context, CheckIndexable(grad));
    Tensor* lanes = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, {NumLanes(grad.NumElements(), bits_)}, &lanes));
    OP_REQUIRES_OK(context, IntQuantizeLauncher<Device>()(context, grad, scale, seed, static_cast<int>(bits_),
                                                          static_cast<int32_t>(levels_), lanes));
  }

 private:
  int64_t bits_;
  int64_t levels_;
};

// lanes: int32 [ceil(size * bits / 32)]; step: float32 scalar -> dense: float32 [size].
template <typename Device>
class IntDequantizeOp : public ::tensorflow::OpKernel {
 public:
  explicit IntDequantizeOp(::tensorflow::OpKernelConstruction* context) : OpKernel(context) {
    OP_REQUIRES_OK(context, context->GetAttr("bits", &bits_));
    OP_REQUIRES_OK(context, context->GetAttr("size", &size_));
    OP_REQUIRES_OK(context, CheckBitsAndLevels(bits_, 1));
    OP_REQUIRES_OK(context, CheckLengthAttr("size", size_));
  }

  void Compute(OpKernelContext* context) override {
    const Tensor& lanes = context->input(0);
    const Tensor& step = context->input(1);
    OP_REQUIRES_OK(context, CheckScalar(step, "step"));
    const int64_t num_lanes = NumLanes(size_, bits_);
    OP_REQUIRES(context, lanes.dims() == 1 && lanes.NumElements() == num_lanes,
                ::tensorflow::errors::InvalidArgument("lanes must be a vector of ", num_lanes, " (size ", size_,
                                                      " at bits=", bits_, "), got shape ",
                                                      lanes.shape().DebugString()));
    Tensor* dense = nullptr;
    OP_REQUIRES_OK(context, context->allocate_output(0, {size_}, &dense));
    OP_REQUIRES_OK(context, IntDequantizeLauncher<Device>()(context, lanes, step, static_cast<int>(bits_), dense));
  }

 private:
  int64_t bits_;
  int64_t size_;
};

REGISTER_KERNEL_BUILDER(Name("Tfcomp>IntQuantize").Device(::tensorflow::DEVICE_CPU), IntQuantizeOp<CpuDevice>);
REGISTER_KERNEL_BUILDER(Name("Tfcomp>IntDequantize").Device(::tensorflow::DEVICE_CPU), IntDequantizeOp<CpuDevice>);
#if TFCOMP_CUDA
REGISTER_KERNEL_BUILDER(Name("Tfcomp>IntQuantize").Device(::tensorflow::DEVICE_GPU), IntQuantizeOp<GpuDevice>);
REGISTER_KERNEL_BUILDER(Name("Tfcomp>IntDequantize").Device(::tensorflow::DEVICE_GPU), IntDequantizeOp<GpuDevice>);
#endif

}  // namespace
}  // namespace tfcomp
