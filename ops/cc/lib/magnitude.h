// Magnitude keys for float32, float16 and bfloat16, framework-free.
//
// Clearing the sign bit of an IEEE-754 value leaves an unsigned integer that orders exactly like |x|:
// +0 < denormals < normals < +Inf < NaN. Every kernel compares and ranks these keys instead of floats,
// which makes one integer code path serve all three dtypes, lets the compare loops vectorise, and puts
// NaN and Inf above every finite threshold, so non-finite gradients are always selected.
#ifndef TFCOMP_OPS_CC_LIB_MAGNITUDE_H_
#define TFCOMP_OPS_CC_LIB_MAGNITUDE_H_

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TFCOMP_HOST_DEVICE __host__ __device__
#else
#define TFCOMP_HOST_DEVICE
#endif

namespace tfcomp {

// The raw bits of a float32 and back, on the host and on a CUDA device.
TFCOMP_HOST_DEVICE inline uint32_t FloatToBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

TFCOMP_HOST_DEVICE inline float BitsToFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

// The float32 bits of a + b for float32 bits a and b: one rounding, as TensorFlow's add gives
// (error feedback's gradient plus residual, added inside the kernels that read both).
TFCOMP_HOST_DEVICE inline uint32_t SumBits(uint32_t a, uint32_t b) { return FloatToBits(BitsToFloat(a) + BitsToFloat(b)); }

// Each format has, besides its masks:
//   RoundUpKey(b): for the bits b of a positive float32 (+Inf included), the key of the smallest
//                  value of the format that is >= it (Inf when there is none);
//   KeyToFloat(k): the float32 value of a magnitude key (exact: every value widens exactly).
struct Float32Format {
  using Bits = uint32_t;
  using SignedBits = int32_t;
  static constexpr Bits kAbsMask = 0x7FFFFFFFu;
  static constexpr Bits kInfKey = 0x7F800000u;
  static constexpr Bits kMaxFiniteKey = 0x7F7FFFFFu;
  TFCOMP_HOST_DEVICE static Bits RoundUpKey(uint32_t b) { return b; }
  TFCOMP_HOST_DEVICE static float KeyToFloat(Bits key) { return BitsToFloat(key); }
};

struct Float16Format {
  using Bits = uint16_t;
  using SignedBits = int16_t;
  static constexpr Bits kAbsMask = 0x7FFF;
  static constexpr Bits kInfKey = 0x7C00;
  static constexpr Bits kMaxFiniteKey = 0x7BFF;
  TFCOMP_HOST_DEVICE static Bits RoundUpKey(uint32_t b) {
    const int exponent = static_cast<int>(b >> 23) - 127;
    if (exponent > 15) return kInfKey;  // above the largest finite half, or +Inf
    if (exponent < -14) {
      // Subnormal range: half values are m * 2^-24, so the key is ceil(t * 2^24) = ceil(s / 2^shift)
      // for t = s * 2^(e - 150), s its significand and e its biased exponent (1 for a float32
      // denormal). Integers only: a float multiply would take a float32-denormal t for 0 when
      // denormals are flushed to zero, as TensorFlow runs its CPU kernels.
      const uint32_t biased = b >> 23;
      const uint32_t significand = biased == 0 ? b : (b & 0x7FFFFFu) | 0x800000u;
      const int shift = 126 - static_cast<int>(biased == 0 ? 1 : biased);  // >= 14
      return static_cast<Bits>(shift >= 24 ? 1 : (significand + (1u << shift) - 1) >> shift);
    }
    const uint32_t mantissa = b & 0x7FFFFFu;
    // Truncate to 10 mantissa bits, then step up when bits were cut (a carry moves the exponent).
    return static_cast<Bits>((static_cast<uint32_t>(exponent + 15) << 10 | mantissa >> 13) +
                             ((mantissa & 0x1FFFu) != 0));
  }
  TFCOMP_HOST_DEVICE static float KeyToFloat(Bits key) {
    const uint32_t exponent = key >> 10, mantissa = key & 0x3FFu;
    if (exponent == 0) return static_cast<float>(mantissa) * (1.0f / 16777216.0f);
    if (exponent == 31) return BitsToFloat(0x7F800000u | mantissa << 13);
    return BitsToFloat((exponent + 112) << 23 | mantissa << 13);
  }
};

struct BFloat16Format {
  using Bits = uint16_t;
  using SignedBits = int16_t;
  static constexpr Bits kAbsMask = 0x7FFF;
  static constexpr Bits kInfKey = 0x7F80;
  static constexpr Bits kMaxFiniteKey = 0x7F7F;
  TFCOMP_HOST_DEVICE static Bits RoundUpKey(uint32_t b) {
    return static_cast<Bits>((b >> 16) + ((b & 0xFFFFu) != 0));
  }
  TFCOMP_HOST_DEVICE static float KeyToFloat(Bits key) { return BitsToFloat(static_cast<uint32_t>(key) << 16); }
};

// The magnitude key of a value given by its raw bits.
template <class Format>
TFCOMP_HOST_DEVICE inline typename Format::Bits MagnitudeKey(typename Format::Bits bits) {
  return static_cast<typename Format::Bits>(bits & Format::kAbsMask);
}

// The smallest magnitude key whose value is >= threshold (a float32): |g| >= threshold exactly when
// the key of g is >= this key, also for float16/bfloat16 gradients, where the threshold generally
// falls between two representable values. A threshold <= 0 or NaN gives key 0 (everything selected).
// Decided on the bits: a float compare would take a denormal threshold for 0 under flush-to-zero.
template <class Format>
TFCOMP_HOST_DEVICE inline typename Format::Bits ThresholdKey(float threshold) {
  const uint32_t bits = FloatToBits(threshold);
  if (bits == 0 || bits > 0x7F800000u) return 0;  // +0, NaN, or the sign bit set
  return Format::RoundUpKey(bits);
}

// True when |x| >= threshold, for x given by its bits and the threshold by its magnitude key
// (see ThresholdKey). NaN and Inf keys exceed every finite threshold key.
// The comparison is done on signed integers (both sides are < 2^(bits-1)) so that it vectorises
// with the baseline x86-64 instruction set.
template <class Format>
TFCOMP_HOST_DEVICE inline bool IsSelected(typename Format::Bits bits, typename Format::Bits threshold_key) {
  using S = typename Format::SignedBits;
  return static_cast<S>(bits & Format::kAbsMask) >= static_cast<S>(threshold_key);
}

}  // namespace tfcomp

#endif  // TFCOMP_OPS_CC_LIB_MAGNITUDE_H_
