/* sample.c - drawing one token from a row of logits (temperature, top-k, top-p, min-p, greedy, an
 * allowed mask): the draw kv_cache.c uses, which finds the top-k / top-p cut by histograms of the
 * probabilities' bits instead of sorting the vocabulary, and the sort-based reference it is tested
 * against. */
#include "model.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the reference: sort the whole vocabulary ---- */

static int by_prob_desc(const void *a, const void *b) {
  const mrl_candidate *x = a, *y = b;
  if (x->p != y->p) return x->p < y->p ? 1 : -1;
  return x->id < y->id ? -1 : 1; /* ties: lower id first, as the greedy choice */
}

int32_t mrl__sample_one_ref(const float *z, int64_t V, const mrl_sampling *s,
                            const uint8_t *allowed, struct mrl_rng *rng, float *p,
                            mrl_candidate *order, float *logp, int64_t *bad, int64_t *support) {
  float temp = s->temperature > 0.0f ? s->temperature : 1.0f;
  float mx = -INFINITY;
  int32_t best = -1;
  for (int64_t j = 0; j < V; j++) {
    if (!isfinite(z[j])) {
      *bad = j;
      return -1;
    }
    if ((!allowed || allowed[j]) && (best < 0 || z[j] > mx)) {
      mx = z[j];
      best = (int32_t)j;
    }
  }
  if (best < 0) return -2; /* nothing allowed */
  double sum = 0.0;
  for (int64_t j = 0; j < V; j++) {
    p[j] = !allowed || allowed[j] ? expf((z[j] - mx) / temp) : 0.0f;
    sum += p[j];
  }
  float log_sum = (float)log(sum);
  if (s->temperature <= 0.0f) {
    *logp = -log_sum; /* z[best] == mx */
    return best;
  }
  /* candidates in descending probability, cut by top-k, top-p and min-p */
  int64_t n = V;
  for (int64_t j = 0; j < V; j++) order[j] = (mrl_candidate){p[j], (int32_t)j};
  bool top_k = s->top_k > 0 && s->top_k < V, top_p = s->top_p > 0.0f && s->top_p < 1.0f;
  if (top_k || top_p) {
    qsort(order, (size_t)V, sizeof *order, by_prob_desc);
    if (top_k) n = s->top_k;
    if (top_p) {
      double mass = 0.0, target = s->top_p * sum;
      int64_t k = 0;
      while (k < n && mass < target) mass += order[k++].p;
      n = k > 0 ? k : 1;
    }
  }
  if (support) *support = n;
  float floor_p = s->min_p > 0.0f ? s->min_p * p[best] : 0.0f;
  double kept = 0.0;
  for (int64_t k = 0; k < n; k++)
    if (order[k].p >= floor_p) kept += order[k].p;
  double u = mrl__rng_uniform(rng) * kept, acc = 0.0;
  int32_t pick = best;
  for (int64_t k = 0; k < n; k++) {
    if (order[k].p < floor_p || (allowed && !allowed[order[k].id])) continue;
    pick = order[k].id;
    acc += order[k].p;
    if (u < acc) break;
  }
  *logp = (z[pick] - mx) / temp - log_sum;
  return pick;
}

/* ---- the draw: select the cut without sorting ----
 *
 * A probability p in [0, 1] is a non-negative float, so its bits, read as an unsigned integer,
 * order as p does; the total order of the reference (p descending, id ascending) is the order of
 * (bits descending, id ascending). The cut (the last token top-k and top-p keep) is found digit
 * by digit of the bits, most significant first: a histogram of counts and masses over the digit
 * names the digit holding the cut, the tokens of higher digits are kept whole, and the tokens of
 * that digit are the group the next digit splits. Three digits (bits 31-20, 19-10, 9-0) leave a
 * group of equal probabilities, which stays in id order, the order the reference breaks ties in.
 * Every pass is linear, whatever the ties (an all-equal row is one group all the way down). */

enum {
  DIGITS = 1024,     /* buckets of a refining digit (10 bits); the first digit (12 bits) fits too */
  SMALL_GROUP = 48,  /* a group this small is sorted instead of refined */
  WALK_BLOCK = 256   /* ids per block of the draw's walk */
};

static inline uint32_t bits_of(float p) {
  uint32_t b;
  memcpy(&b, &p, sizeof b);
  return b;
}

/* The last token the cut keeps: a token is kept when it is not after it in the total order. */
typedef struct {
  uint32_t bits;
  int32_t id;
} cut_point;

static inline bool kept_by(uint32_t bits, int64_t id, cut_point c) {
  return bits > c.bits || (bits == c.bits && id <= c.id);
}

/* Whether the draw keeps token j: not after the cut, not under the min-p floor, allowed. */
static inline bool keeps(const float *p, int64_t j, cut_point c, float floor_p,
                         const uint8_t *allowed) {
  return kept_by(bits_of(p[j]), j, c) && p[j] >= floor_p && (!allowed || allowed[j]);
}

/* The kept mass of ids [j0, j1), in four interleaved sums (no chain of dependent additions). */
static double kept_mass(const float *p, int64_t j0, int64_t j1, cut_point c, float floor_p,
                        const uint8_t *allowed) {
  double m0 = 0.0, m1 = 0.0, m2 = 0.0, m3 = 0.0;
  int64_t j = j0;
  for (; j + 4 <= j1; j += 4) {
    m0 += keeps(p, j, c, floor_p, allowed) ? p[j] : 0.0f;
    m1 += keeps(p, j + 1, c, floor_p, allowed) ? p[j + 1] : 0.0f;
    m2 += keeps(p, j + 2, c, floor_p, allowed) ? p[j + 2] : 0.0f;
    m3 += keeps(p, j + 3, c, floor_p, allowed) ? p[j + 3] : 0.0f;
  }
  for (; j < j1; j++) m0 += keeps(p, j, c, floor_p, allowed) ? p[j] : 0.0f;
  return (m0 + m1) + (m2 + m3);
}

/* Sorts a small group into the total order (insertion sort: linear on a sorted group). */
static void sort_group(mrl_candidate *g, int64_t n) {
  for (int64_t i = 1; i < n; i++) {
    mrl_candidate x = g[i];
    int64_t k = i;
    while (k > 0 && (g[k - 1].p < x.p || (g[k - 1].p == x.p && g[k - 1].id > x.id))) {
      g[k] = g[k - 1];
      k--;
    }
    g[k] = x;
  }
}

/* The digit holding the cut, walking the histogram from the top: the first digit where the count
 * kept so far reaches need or the mass reaches target (*above and *above_mass then hold the count
 * and mass of the higher digits); -1 when no digit does. */
static int cut_digit(const int64_t *count, const double *mass, int64_t need, double target,
                     int64_t *above, double *above_mass) {
  for (int d = DIGITS - 1; d >= 0; d--) {
    if (*above + count[d] >= need || *above_mass + mass[d] >= target) return d;
    *above += count[d];
    *above_mass += mass[d];
  }
  return -1;
}

/* The reference's cut (top-k, then the shortest prefix reaching top_p * sum) found by histograms,
 * using g (V entries) for the groups. The reference adds the masses in sorted order, this in
 * another order, so the two sums can round differently: when all the probabilities are multiples
 * of the smallest one's last bit and the total stays below 2^52 of those, every sum is exact and
 * both agree; otherwise the cut is accepted only when the prefix masses on both sides of it are
 * farther from the target than any rounding of either sum. False when it is not (the caller then
 * sorts). */
static bool find_cut(const float *p, int64_t V, const mrl_sampling *s, double sum,
                     mrl_candidate *g, cut_point *out) {
  int64_t need = s->top_k > 0 && s->top_k < V ? s->top_k : V;
  bool top_p = s->top_p > 0.0f && s->top_p < 1.0f;
  double target = top_p ? s->top_p * sum : INFINITY;
  int64_t count[DIGITS];
  double mass[DIGITS];
  memset(count, 0, sizeof count);
  memset(mass, 0, sizeof mass);
  for (int64_t j = 0; j < V; j++) {
    uint32_t d = bits_of(p[j]) >> 20;
    count[d]++;
    mass[d] += p[j];
  }
  int lowest = 0;
  while (lowest < DIGITS && mass[lowest] == 0.0) lowest++;
  /* digit 0 holds zeros and subnormals; digit d >= 8 the floats of exponent field d / 8 */
  bool exact = lowest >= 8 && ldexp(sum, 150 - lowest / 8) < 0x1p52;
  double bound = exact ? 0.0 : 4.0 * (double)(V + 4 * DIGITS) * DBL_EPSILON * sum;

  int64_t above = 0;
  double above_mass = 0.0;
  int d = cut_digit(count, mass, need, target, &above, &above_mass);
  if (d < 0) { /* top-p alone and the whole vocabulary short of the target: all kept */
    if (!(above_mass < target - bound)) return false;
    *out = (cut_point){0, INT32_MAX};
    return true;
  }
  int64_t n = 0;
  for (int64_t j = 0; j < V; j++) {
    g[n] = (mrl_candidate){p[j], (int32_t)j};
    n += (bits_of(p[j]) >> 20) == (uint32_t)d;
  }
  for (int shift = 10; shift >= 0 && n > SMALL_GROUP; shift -= 10) {
    memset(count, 0, sizeof count);
    memset(mass, 0, sizeof mass);
    for (int64_t i = 0; i < n; i++) {
      uint32_t e = (bits_of(g[i].p) >> shift) & (DIGITS - 1);
      count[e]++;
      mass[e] += g[i].p;
    }
    d = cut_digit(count, mass, need, target, &above, &above_mass);
    if (d < 0) return false; /* the group's mass fell short of what its sum promised: rounding */
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
      g[m] = g[i];
      m += ((bits_of(g[i].p) >> shift) & (DIGITS - 1)) == (uint32_t)d;
    }
    n = m;
  }
  sort_group(g, n);
  double before = above_mass;
  int64_t i = 0;
  while (i < n && above < need && above_mass < target) {
    before = above_mass;
    above_mass += g[i++].p;
    above++;
  }
  if (i == n && above < need && above_mass < target) return false; /* rounding, as above */
  if (top_p && !(before < target - bound)) return false;
  if (top_p && above < need && !(above_mass >= target + bound)) return false;
  *out = (cut_point){bits_of(g[i - 1].p), g[i - 1].id};
  return true;
}

/* The reference's cut by sorting (order: V entries), for rows find_cut cannot settle. */
static cut_point sorted_cut(const float *p, int64_t V, const mrl_sampling *s, double sum,
                            mrl_candidate *order) {
  for (int64_t j = 0; j < V; j++) order[j] = (mrl_candidate){p[j], (int32_t)j};
  qsort(order, (size_t)V, sizeof *order, by_prob_desc);
  int64_t n = s->top_k > 0 && s->top_k < V ? s->top_k : V;
  if (s->top_p > 0.0f && s->top_p < 1.0f) {
    double mass = 0.0, target = s->top_p * sum;
    int64_t k = 0;
    while (k < n && mass < target) mass += order[k++].p;
    n = k > 0 ? k : 1;
  }
  return (cut_point){bits_of(order[n - 1].p), order[n - 1].id};
}

int32_t mrl__sample_one(const float *z, int64_t V, const mrl_sampling *s, const uint8_t *allowed,
                        struct mrl_rng *rng, float *p, mrl_candidate *cand, float *logp,
                        int64_t *bad, int64_t *support) {
  float temp = s->temperature > 0.0f ? s->temperature : 1.0f;
  float mx = -INFINITY;
  int32_t best = -1;
  for (int64_t j = 0; j < V; j++) {
    if (!isfinite(z[j])) {
      *bad = j;
      return -1;
    }
    if ((!allowed || allowed[j]) && (best < 0 || z[j] > mx)) {
      mx = z[j];
      best = (int32_t)j;
    }
  }
  if (best < 0) return -2; /* nothing allowed */
  double sum = 0.0;
  for (int64_t j = 0; j < V; j++) {
    p[j] = !allowed || allowed[j] ? expf((z[j] - mx) / temp) : 0.0f;
    sum += p[j];
  }
  float log_sum = (float)log(sum);
  if (s->temperature <= 0.0f) {
    *logp = -log_sum; /* z[best] == mx */
    return best;
  }
  float floor_p = s->min_p > 0.0f ? s->min_p * p[best] : 0.0f;
  int32_t pick = best;
  double acc = 0.0;
  if (!(s->top_k > 0 && s->top_k < V) && !(s->top_p > 0.0f && s->top_p < 1.0f)) {
    /* every token, in id order, as the reference walks them; without a floor the kept mass is
     * the same additions in the same order as sum */
    double kept = 0.0;
    if (floor_p > 0.0f) {
      for (int64_t j = 0; j < V; j++)
        if (p[j] >= floor_p) kept += p[j];
    } else {
      kept = sum;
    }
    double u = mrl__rng_uniform(rng) * kept;
    for (int64_t j = 0; j < V; j++) {
      if (p[j] < floor_p || (allowed && !allowed[j])) continue;
      pick = (int32_t)j;
      acc += p[j];
      if (u < acc) break;
    }
    if (support) *support = -1;
  } else {
    cut_point c;
    if (!find_cut(p, V, s, sum, cand, &c)) c = sorted_cut(p, V, s, sum, cand);
    /* the kept mass of each block of ids (in the scratch cand, no longer needed), then the draw:
     * whole blocks, then the ids of the block it falls in */
    double *block = (double *)(void *)cand, kept = 0.0;
    int64_t blocks = (V + WALK_BLOCK - 1) / WALK_BLOCK, last = 0;
    for (int64_t b = 0; b < blocks; b++) {
      block[b] = kept_mass(p, b * WALK_BLOCK, b * WALK_BLOCK + WALK_BLOCK < V ? b * WALK_BLOCK + WALK_BLOCK : V, c, floor_p, allowed);
      kept += block[b];
      if (block[b] > 0.0) last = b;
    }
    double u = mrl__rng_uniform(rng) * kept;
    int64_t b = 0;
    while (b < last && !(u < acc + block[b])) acc += block[b++];
    int64_t end = b * WALK_BLOCK + WALK_BLOCK < V ? b * WALK_BLOCK + WALK_BLOCK : V;
    for (int64_t j = b * WALK_BLOCK; j < end; j++) {
      if (!keeps(p, j, c, floor_p, allowed)) continue;
      pick = (int32_t)j;
      acc += p[j];
      if (u < acc) break;
    }
    if (support) { /* for the tests: the kept set, in id order */
      int64_t n = 0;
      for (int64_t j = 0; j < V; j++)
        if (keeps(p, j, c, floor_p, allowed)) cand[n++] = (mrl_candidate){p[j], (int32_t)j};
      *support = n;
    }
  }
  *logp = (z[pick] - mx) / temp - log_sum;
  return pick;
}
