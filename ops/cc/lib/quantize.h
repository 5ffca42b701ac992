// int_quantize / int_dequantize's core (IntQuant): integer levels packed so that an integer
// allreduce sums them, framework-free and shared by the CPU and CUDA kernels.
//
// Element i becomes the level clamp(floor(g[i] * (levels / scale) + u_i), -levels, levels), with
// u_i = Uniform24(Mix64(seed), i) in [0, 1) (so that the level's expectation is g[i] * levels /
// scale), computed in float32 one rounding at a time (levels / scale once, then multiply, add); a
// non-finite result, or a scale that is not a positive finite number, gives level 0. 32 / bits levels are packed into one
// int32, level j of a lane times 2^(bits j): sums of such lanes are the lanes of the levels' sums as
// long as every field's sum stays in [-2^(bits-1), 2^(bits-1) - 1].
#ifndef TFCOMP_OPS_CC_LIB_QUANTIZE_H_
#define TFCOMP_OPS_CC_LIB_QUANTIZE_H_

#include <cstdint>

#include "ops/cc/lib/hashing.h"
#include "ops/cc/lib/magnitude.h"

namespace tfcomp {

// A uniform float in [0, 1) with 24 random bits for element i: SplitMix64's finaliser of key + i,
// key = Mix64(seed) (one 64-bit mix per element).
TFCOMP_HOST_DEVICE inline float Uniform24(uint64_t key, int64_t i) {
  return static_cast<float>(Mix64(key + static_cast<uint64_t>(i)) >> 40) * (1.0f / 16777216.0f);
}

// The level of one element: x = g * per_level + noise (per_level = levels / scale, both float32
// roundings), clamp(floor(x), -levels, levels); 0 where x is not finite or !valid_scale.
TFCOMP_HOST_DEVICE inline int32_t LevelOf(float g, float per_level, bool valid_scale, int32_t levels, float noise) {
#if defined(__CUDA_ARCH__)
  const float x = __fadd_rn(__fmul_rn(g, per_level), noise);
#else
  const float x = g * per_level + noise;
#endif
  // Branch-free (random signs would defeat a predictor): non-finite x (x - x is NaN) counts as 0,
  // the clamp then keeps it in int32's range, and the truncation is corrected down to the floor.
  const float top = static_cast<float>(levels);
  const float finite = (valid_scale && x - x == 0.0f) ? x : 0.0f;
  const float clamped = finite < -top ? -top : (finite > top ? top : finite);
  const int32_t truncated = static_cast<int32_t>(clamped);
  return truncated - static_cast<int32_t>(clamped < static_cast<float>(truncated));
}

TFCOMP_HOST_DEVICE inline bool IsValidScale(float scale) { return scale > 0.0f && scale <= 3.402823466e38f; }

// The levels of values[0, count) packed into one lane, bits each (count <= 32 / bits), values[j]
// being element first + j of the gradient (whose index draws its noise).
// (key = Mix64(seed), per_level = levels / scale in float32, valid = IsValidScale(scale).)
TFCOMP_HOST_DEVICE inline int32_t PackLevels(const float* values, int count, int64_t first, float per_level, bool valid,
                                             int32_t levels, int bits, uint64_t key) {
  int64_t packed = 0;
  for (int j = 0; j < count; ++j) {
    packed += static_cast<int64_t>(LevelOf(values[j], per_level, valid, levels, Uniform24(key, first + j))) << (bits * j);
  }
  return static_cast<int32_t>(packed);  // |packed| < 2^31: exact
}

// Lane `lane` of the packed levels of g[0, size): 32 / bits elements per lane (fewer in the last).
TFCOMP_HOST_DEVICE inline int32_t PackedLane(const float* g, int64_t size, float per_level, bool valid, int32_t levels,
                                             int bits, uint64_t key, int64_t lane) {
  const int64_t fields = 32 / bits, first = lane * fields;
  const int count = static_cast<int>(size - first < fields ? (size > first ? size - first : 0) : fields);
  return PackLevels(g + first, count, first, per_level, valid, levels, bits, key);
}

// The signed fields of one lane, lowest first, into out[0, count) times step.
TFCOMP_HOST_DEVICE inline void UnpackLane(int32_t lane, int bits, int count, float step, float* out) {
  const int64_t half = int64_t{1} << (bits - 1);
  const int64_t mask = (int64_t{1} << bits) - 1;
  int64_t x = lane;
  for (int j = 0; j < count; ++j) {
    const int64_t field = ((x + half) & mask) - half;
#if defined(__CUDA_ARCH__)
    out[j] = __fmul_rn(static_cast<float>(field), step);
#else
    out[j] = static_cast<float>(field) * step;
#endif
    x = (x - field) >> bits;
  }
}

}  // namespace tfcomp

#endif  // TFCOMP_OPS_CC_LIB_QUANTIZE_H_
