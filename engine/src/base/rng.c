/* rng.c - seeded, machine-independent random numbers: xoshiro256** seeded by splitmix64. */
#include "internal.h"

#include <math.h>
#include <string.h>

static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void mrl__rng_seed(struct mrl_rng *r, uint64_t seed) {
  uint64_t x = seed;
  for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
  r->has_spare = 0;
  r->spare = 0.0;
}

uint64_t mrl__rng_u64(struct mrl_rng *r) {
  uint64_t *s = r->s;
  uint64_t result = rotl(s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

/* 53 random bits scaled into [0, 1): exact in double, identical everywhere. */
double mrl__rng_uniform(struct mrl_rng *r) {
  return (double)(mrl__rng_u64(r) >> 11) * 0x1.0p-53;
}

double mrl__rng_normal(struct mrl_rng *r) {
  if (r->has_spare) {
    r->has_spare = 0;
    return r->spare;
  }
  double u1 = 1.0 - mrl__rng_uniform(r); /* in (0, 1]: log is finite */
  double u2 = mrl__rng_uniform(r);
  double radius = sqrt(-2.0 * log(u1));
  double angle = 6.283185307179586476925 * u2;
  r->spare = radius * sin(angle);
  r->has_spare = 1;
  return radius * cos(angle);
}

mrl_status mrl_rng_new(mrl_engine *e, uint64_t seed, mrl_rng **out) {
  if (!e) return MRL_ERR_NULL;
  if (!out) return mrl__fail(e, MRL_ERR_NULL, "mrl_rng_new", "out is NULL");
  mrl_rng *r = mrl__alloc(e, sizeof *r);
  if (!r) return mrl__fail(e, MRL_ERR_NOMEM, "mrl_rng_new", "cannot allocate an RNG");
  memset(r, 0, sizeof *r);
  mrl__rng_seed(r, seed);
  r->engine = e;
  mrl__engine_retain(e);
  *out = r;
  return MRL_OK;
}

void mrl_rng_free(mrl_rng *rng) {
  if (!rng || !rng->engine) return; /* the engine's own RNG is not freed separately */
  mrl_engine *e = rng->engine;
  mrl__free(e, rng, sizeof *rng);
  mrl__engine_release(e);
}

mrl_status mrl_rng_seed(mrl_rng *rng, uint64_t seed) {
  if (!rng) return MRL_ERR_NULL;
  mrl__rng_seed(rng, seed);
  return MRL_OK;
}

mrl_status mrl_rng_u64(mrl_rng *rng, uint64_t *out) {
  if (!rng || !out) return MRL_ERR_NULL;
  *out = mrl__rng_u64(rng);
  return MRL_OK;
}

mrl_status mrl_rng_uniform(mrl_rng *rng, double *out) {
  if (!rng || !out) return MRL_ERR_NULL;
  *out = mrl__rng_uniform(rng);
  return MRL_OK;
}

/* hi:lo = a * b, from 32-bit halves (C11 has no 128-bit integer) */
static uint64_t mul_wide(uint64_t a, uint64_t b, uint64_t *lo) {
  uint64_t a0 = a & 0xffffffffu, a1 = a >> 32, b0 = b & 0xffffffffu, b1 = b >> 32;
  uint64_t p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
  uint64_t mid = (p00 >> 32) + (p01 & 0xffffffffu) + (p10 & 0xffffffffu);
  *lo = (mid << 32) | (p00 & 0xffffffffu);
  return p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);
}

/* A draw x maps to floor(x * count / 2^64), the high word of x * count: for spans up to 2^53
 * what floor(uniform * count) gives but for a chance of about count / 2^53. The low word tells
 * the 2^64 mod count draws that would favour some results apart; those are drawn again. */
mrl_status mrl_rng_int(mrl_rng *rng, int64_t lo, int64_t hi, int64_t *out) {
  if (!rng || !out) return MRL_ERR_NULL;
  if (lo > hi)
    return rng->engine ? mrl__fail(rng->engine, MRL_ERR_INVALID, "mrl_rng_int",
                                   "the interval [%lld, %lld] is empty", (long long)lo,
                                   (long long)hi)
                       : MRL_ERR_INVALID;
  uint64_t count = (uint64_t)hi - (uint64_t)lo + 1, r = mrl__rng_u64(rng);
  if (count != 0) { /* count 0: all 2^64 integers, r itself */
    uint64_t low;
    r = mul_wide(r, count, &low);
    if (low < count) {
      uint64_t unfair = (0 - count) % count; /* 2^64 mod count */
      while (low < unfair) r = mul_wide(mrl__rng_u64(rng), count, &low);
    }
  }
  uint64_t v = (uint64_t)lo + r; /* back to int64 without an implementation-defined cast */
  *out = v <= (uint64_t)INT64_MAX ? (int64_t)v : -(int64_t)(UINT64_MAX - v) - 1;
  return MRL_OK;
}

mrl_status mrl_rng_normal(mrl_rng *rng, double *out) {
  if (!rng || !out) return MRL_ERR_NULL;
  *out = mrl__rng_normal(rng);
  return MRL_OK;
}
