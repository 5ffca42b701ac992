// Magnitude keys for float32, float16 and bfloat16, framework-free.
//
// Clearing the sign bit of an IEEE-754 value leaves an unsigned integer that orders exactly like |x|:
// +0 < denormals < normals < +Inf < NaN. Every kernel compares and ranks these keys instead of floats,
// which makes one integer code path serve all three dtypes, lets the compare loops vectorise, and puts
// NaN and Inf above every finite threshold, so non-finite gradients are always selected.
#ifndef TFCOMP_OPS_CC_LIB_MAGNITUDE_H_
#define TFCOMP_OPS_CC_LIB_MAGNITUDE_H_

#include <cstdint>

#if defined(__CUDACC__)
#define TFCOMP_HOST_DEVICE __host__ __device__
#else
#define TFCOMP_HOST_DEVICE
#endif

namespace tfcomp {

struct Float32Format {
  using Bits = uint32_t;
  using SignedBits = int32_t;
  static constexpr Bits kAbsMask = 0x7FFFFFFFu;
  static constexpr Bits kInfKey = 0x7F800000u;
  static constexpr Bits kMaxFiniteKey = 0x7F7FFFFFu;
};

struct Float16Format {
  using Bits = uint16_t;
  using SignedBits = int16_t;
  static constexpr Bits kAbsMask = 0x7FFF;
  static constexpr Bits kInfKey = 0x7C00;
  static constexpr Bits kMaxFiniteKey = 0x7BFF;
};

struct BFloat16Format {
  using Bits = uint16_t;
  using SignedBits = int16_t;
  static constexpr Bits kAbsMask = 0x7FFF;
  static constexpr Bits kInfKey = 0x7F80;
  static constexpr Bits kMaxFiniteKey = 0x7F7F;
};

// The magnitude key of a value given by its raw bits.
template <class Format>
TFCOMP_HOST_DEVICE inline typename Format::Bits MagnitudeKey(typename Format::Bits bits) {
  return static_cast<typename Format::Bits>(bits & Format::kAbsMask);
}

// True when |x| >= threshold, for x given by its bits and the threshold by its magnitude key
// (see ThresholdKey in the kernels). NaN and Inf keys exceed every finite threshold key.
// The comparison is done on signed integers (both sides are < 2^(bits-1)) so that it vectorises
// with the baseline x86-64 instruction set.
template <class Format>
TFCOMP_HOST_DEVICE inline bool IsSelected(typename Format::Bits bits, typename Format::Bits threshold_key) {
  using S = typename Format::SignedBits;
  return static_cast<S>(bits & Format::kAbsMask) >= static_cast<S>(threshold_key);
}

}  // namespace tfcomp

#endif  // TFCOMP_OPS_CC_LIB_MAGNITUDE_H_
