/* kernel_math.h - what the model's plain-C kernels (attention.c, head.c, gemv.c) share: the
 * attributes that let gcc vectorize them and compile them once per x86-64 level, and an exp
 * written for vectorizing. Not installed. */
#ifndef MRL_KERNEL_MATH_H
#define MRL_KERNEL_MATH_H

#include <stdint.h>
#include <string.h>

/* Without trapping math (which changes no result, only whether FP exceptions count as
 * observable), gcc may turn float selects into vector masks; with contraction, a * b + c into an
 * FMA. */
#if defined(__GNUC__) && !defined(__clang__)
#define MRL_MATH __attribute__((optimize("no-trapping-math", "fp-contract=fast")))
#define MRL_MATH_INLINE                                                                            \
  __attribute__((always_inline, optimize("no-trapping-math", "fp-contract=fast"))) inline
#else
#define MRL_MATH
#define MRL_MATH_INLINE inline
#endif
/* a kernel compiled for x86-64-v4 (AVX-512), v3 (AVX2) and the baseline, chosen at load time */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MRL_KERNEL                                                                                 \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) MRL_MATH
#else
#define MRL_KERNEL MRL_MATH
#endif

/* e^x within a few ulp of expf where the result is a normal float (x in [-87, 88]; below, 0):
 * x = k ln2 + r with |r| <= ln2 / 2 (ln2 in two parts, so k ln2 is exact), e^r by its Taylor
 * series to r^7 (the remainder is under 1e-8), 2^k put together in the exponent bits. Written for
 * vectorizing: no branches, no calls, no float-to-int conversion (k's bits are read off the
 * rounding constant instead, well defined even for NaN, which stays NaN). */
static MRL_MATH_INLINE float mrl__exp_kernel(float x) {
  float c = x > 88.0f ? 88.0f : x;
  c = c < -87.0f ? -87.0f : c;
  const float round = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer (low bits) */
  float t = c * 1.44269504f + round, k = t - round;
  float r = (c - k * 0.693359375f) - k * -2.12194440e-4f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  uint32_t bits;
  memcpy(&bits, &t, sizeof bits);
  bits = (bits - 0x4b400000u + 127u) << 23; /* the bits of t hold round + k */
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  return x < -87.0f ? 0.0f : p * scale;
}

#endif /* MRL_KERNEL_MATH_H */
