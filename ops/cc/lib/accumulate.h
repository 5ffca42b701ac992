// Error feedback's accumulation under an optimizer correction, element by element, framework-free
// (CPU and CUDA): DGC's momentum correction (004 Algorithm 3, after Lin et al.) and the Adam
// correction, each in one pass that reads the gradient, the moments and the residual and writes the
// new moments and the accumulated gradient (instead of one pass per TensorFlow op).
//
// Every operation is one float32 operation rounded to nearest, in the order written below: no fused
// multiply-add (the CUDA code uses the _rn intrinsics, which nvcc never contracts; x86-64's baseline
// has no FMA instruction for the host compiler to contract into), so the CPU and the GPU give the
// results of the same sequence of TensorFlow ops, bit for bit, denormals aside (TensorFlow's CPU
// threads flush them to zero).
#ifndef TFCOMP_OPS_CC_LIB_ACCUMULATE_H_
#define TFCOMP_OPS_CC_LIB_ACCUMULATE_H_

#include <cmath>
#include <cstdint>

#if defined(__SSE2__) && !defined(__CUDACC__)
#include <emmintrin.h>
#endif

#include "ops/cc/lib/magnitude.h"

namespace tfcomp {

// One rounded float32 operation each.
TFCOMP_HOST_DEVICE inline float RoundedMul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

TFCOMP_HOST_DEVICE inline float RoundedAdd(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

TFCOMP_HOST_DEVICE inline float RoundedDiv(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

TFCOMP_HOST_DEVICE inline float RoundedSqrt(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

// The Adam correction's scalars, float32 as the exchange computes them: beta_1, beta_2 and epsilon,
// 1 - beta_1 and 1 - beta_2 (each rounded once from the exact difference), and the bias corrections
// 1 - beta_1^t and 1 - beta_2^t of step t.
struct AdamCoefficients {
  float beta_1;
  float one_minus_beta_1;
  float beta_2;
  float one_minus_beta_2;
  float epsilon;
  float m_correction;
  float v_correction;
};

// Element i of DGC's momentum correction: u' = mu * u + g, written to new_momentum, and the
// accumulated gradient r + u' (u' where residual is null), written to accumulated (unless null).
TFCOMP_HOST_DEVICE inline void MomentumAccumulateAt(int64_t i, const float* grad, const float* momentum,
                                                    const float* residual, float mu, float* new_momentum,
                                                    float* accumulated) {
  const float u = RoundedAdd(RoundedMul(mu, momentum[i]), grad[i]);
  new_momentum[i] = u;
  if (accumulated != nullptr) accumulated[i] = residual == nullptr ? u : RoundedAdd(residual[i], u);
}

// Element i of the Adam correction: m' = beta_1 m + (1 - beta_1) g and v' = beta_2 v + (1 - beta_2) g^2,
// written to new_m and new_v, and the accumulated gradient r + d (d where residual is null), written to
// accumulated, of Adam's bias-corrected direction d = (m' / (1 - beta_1^t)) / (sqrt(v' / (1 - beta_2^t))
// + epsilon).
TFCOMP_HOST_DEVICE inline void AdamAccumulateAt(int64_t i, const float* grad, const float* m, const float* v,
                                                const float* residual, const AdamCoefficients& c, float* new_m,
                                                float* new_v, float* accumulated) {
  const float g = grad[i];
  const float m1 = RoundedAdd(RoundedMul(c.beta_1, m[i]), RoundedMul(c.one_minus_beta_1, g));
  const float v1 = RoundedAdd(RoundedMul(c.beta_2, v[i]), RoundedMul(c.one_minus_beta_2, RoundedMul(g, g)));
  new_m[i] = m1;
  new_v[i] = v1;
  const float direction = RoundedDiv(RoundedDiv(m1, c.m_correction),
                                     RoundedAdd(RoundedSqrt(RoundedDiv(v1, c.v_correction)), c.epsilon));
  accumulated[i] = residual == nullptr ? direction : RoundedAdd(residual[i], direction);
}

#if !defined(__CUDACC__)
#if defined(__SSE2__)
// Stores four floats at p: by a non-temporal store where `stream` (p 16-byte aligned), which skips
// reading the line first, for a new momentum that nothing reads again in the step.
inline void StoreFour(float* p, __m128 x, bool stream) {
  if (stream) {
    _mm_stream_ps(p, x);
  } else {
    _mm_storeu_ps(p, x);
  }
}

inline bool Aligned16(const float* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
#endif

// MomentumAccumulateAt for every i in [begin, end), four elements at a time where the machine has
// SSE2 (its multiply and add round as the scalar ones do). The new momentum is written by
// non-temporal stores where the accumulated gradient is a tensor of its own: the encode reads that
// one next, and the momentum only in the next step.
inline void MomentumAccumulateRange(int64_t begin, int64_t end, const float* grad, const float* momentum,
                                    const float* residual, float mu, float* new_momentum, float* accumulated) {
  int64_t i = begin;
#if defined(__SSE2__)
  const __m128 mu4 = _mm_set1_ps(mu);
  const bool stream = accumulated != nullptr && Aligned16(new_momentum + i);
  for (; i + 4 <= end; i += 4) {
    const __m128 u = _mm_add_ps(_mm_mul_ps(mu4, _mm_loadu_ps(momentum + i)), _mm_loadu_ps(grad + i));
    StoreFour(new_momentum + i, u, stream);
    if (accumulated != nullptr) {
      _mm_storeu_ps(accumulated + i, residual == nullptr ? u : _mm_add_ps(_mm_loadu_ps(residual + i), u));
    }
  }
  if (stream) _mm_sfence();
#endif
  for (; i < end; ++i) MomentumAccumulateAt(i, grad, momentum, residual, mu, new_momentum, accumulated);
}

// AdamAccumulateAt for every i in [begin, end), four elements at a time where the machine has SSE2
// (its division and square root are correctly rounded, as the scalar ones are). Plain stores: with
// non-temporal stores of the new moments the Adam exchange step took 1.5 to 2x as long.
inline void AdamAccumulateRange(int64_t begin, int64_t end, const float* grad, const float* m, const float* v,
                                const float* residual, const AdamCoefficients& c, float* new_m, float* new_v,
                                float* accumulated) {
  int64_t i = begin;
#if defined(__SSE2__)
  const __m128 beta_1 = _mm_set1_ps(c.beta_1), one_minus_beta_1 = _mm_set1_ps(c.one_minus_beta_1);
  const __m128 beta_2 = _mm_set1_ps(c.beta_2), one_minus_beta_2 = _mm_set1_ps(c.one_minus_beta_2);
  const __m128 epsilon = _mm_set1_ps(c.epsilon);
  const __m128 m_correction = _mm_set1_ps(c.m_correction), v_correction = _mm_set1_ps(c.v_correction);
  for (; i + 4 <= end; i += 4) {
    const __m128 g = _mm_loadu_ps(grad + i);
    const __m128 m1 = _mm_add_ps(_mm_mul_ps(beta_1, _mm_loadu_ps(m + i)), _mm_mul_ps(one_minus_beta_1, g));
    const __m128 v1 =
        _mm_add_ps(_mm_mul_ps(beta_2, _mm_loadu_ps(v + i)), _mm_mul_ps(one_minus_beta_2, _mm_mul_ps(g, g)));
    _mm_storeu_ps(new_m + i, m1);
    _mm_storeu_ps(new_v + i, v1);
    const __m128 direction = _mm_div_ps(_mm_div_ps(m1, m_correction),
                                        _mm_add_ps(_mm_sqrt_ps(_mm_div_ps(v1, v_correction)), epsilon));
    _mm_storeu_ps(accumulated + i, residual == nullptr ? direction : _mm_add_ps(_mm_loadu_ps(residual + i), direction));
  }
#endif
  for (; i < end; ++i) AdamAccumulateAt(i, grad, m, v, residual, c, new_m, new_v, accumulated);
}
#endif  // !defined(__CUDACC__)

}  // namespace tfcomp

#endif  // TFCOMP_OPS_CC_LIB_ACCUMULATE_H_
