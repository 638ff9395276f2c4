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

/* The largest allowed logit's index (the lowest on ties) with *mx its value; -1 with *bad at the
 * first logit that is not finite; -2 when allowed marks no token. Both draws start here. */
static int32_t allowed_argmax(const float *z, int64_t V, const uint8_t *allowed, float *mx,
                              int64_t *bad) {
  int32_t best = -1;
  *mx = -INFINITY;
  for (int64_t j = 0; j < V; j++) {
    if (!isfinite(z[j])) {
      *bad = j;
      return -1;
    }
    if ((!allowed || allowed[j]) && (best < 0 || z[j] > *mx)) {
      *mx = z[j];
      best = (int32_t)j;
    }
  }
  return best < 0 ? -2 : best;
}

int32_t mrl__sample_one_ref(const float *z, int64_t V, const mrl_sampling *s,
                            const uint8_t *allowed, struct mrl_rng *rng, float *p,
                            mrl_candidate *order, float *logp, int64_t *bad, int64_t *support) {
  float temp = s->temperature > 0.0f ? s->temperature : 1.0f;
  float mx;
  int32_t best = allowed_argmax(z, V, allowed, &mx, bad);
  if (best < 0) return best;
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
 * Every pass is linear, whatever the ties (an all-equal row is one group all the way down); the
 * first histogram is built in the loop that computes p.
 * The draw then walks the kept tokens in id order (any fixed order draws from the same
 * distribution, and this one needs no sort): the tokens gathered with the first digit when they
 * are few (top-k, peaked rows), otherwise blocks of WALK_BLOCK ids whose kept masses are known,
 * skipped whole up to the one the draw falls in. */

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

/* A histogram bucket: its tokens and their mass, side by side (two arrays a power of two apart
 * would alias in the store buffer and slow the histogram loops down). */
typedef struct {
  double mass;
  int64_t count;
} bin;

/* The last token the cut keeps: a token is kept when it is not after it in the total order. */
typedef struct {
  uint32_t bits;
  int32_t id;
} cut_point;

static inline bool kept_by(uint32_t bits, int64_t id, cut_point c) {
  return bits > c.bits || (bits == c.bits && id <= c.id);
}

/* Whether the draw keeps token j: not after the cut, not under the min-p floor, allowed. */
static inline bool keeps(float pj, int64_t j, cut_point c, float floor_p,
                         const uint8_t *allowed) {
  return kept_by(bits_of(pj), j, c) && pj >= floor_p && (!allowed || allowed[j]);
}

/* keeps without branches: 1.0f or 0.0f (the kept tokens are many and unpredictable). */
static inline float keep_weight(float pj, int64_t j, cut_point c, float floor_p,
                                const uint8_t *allowed) {
  uint32_t b = bits_of(pj);
  int k = ((b > c.bits) | ((b == c.bits) & (j <= c.id))) & (pj >= floor_p);
  if (allowed) k &= allowed[j] != 0;
  return (float)k;
}

/* The kept mass of ids [j0, j1), in four interleaved sums (no chain of dependent additions). */
static double kept_mass(const float *p, int64_t j0, int64_t j1, cut_point c, float floor_p,
                        const uint8_t *allowed) {
  double m0 = 0.0, m1 = 0.0, m2 = 0.0, m3 = 0.0;
  int64_t j = j0;
  for (; j + 4 <= j1; j += 4) {
    m0 += p[j] * keep_weight(p[j], j, c, floor_p, allowed);
    m1 += p[j + 1] * keep_weight(p[j + 1], j + 1, c, floor_p, allowed);
    m2 += p[j + 2] * keep_weight(p[j + 2], j + 2, c, floor_p, allowed);
    m3 += p[j + 3] * keep_weight(p[j + 3], j + 3, c, floor_p, allowed);
  }
  for (; j < j1; j++) m0 += p[j] * keep_weight(p[j], j, c, floor_p, allowed);
  return (m0 + m1) + (m2 + m3);
}

/* Gathers the tokens of ids [j0, j1) whose first digit is d into g (from g[*n] on) and returns
 * the mass of those above digit d and over floor_p (four interleaved sums, no branches). */
static double gather_digit(const float *p, int64_t j0, int64_t j1, uint32_t d, float floor_p,
                           mrl_candidate *g, int64_t *n) {
  double m[4] = {0.0, 0.0, 0.0, 0.0};
  int64_t k = *n, j = j0;
  for (; j + 4 <= j1; j += 4)
    for (int i = 0; i < 4; i++) {
      uint32_t e = bits_of(p[j + i]) >> 20;
      g[k] = (mrl_candidate){p[j + i], (int32_t)(j + i)};
      k += e == d;
      m[i] += p[j + i] * (float)((e > d) & (p[j + i] >= floor_p));
    }
  for (; j < j1; j++) {
    uint32_t e = bits_of(p[j]) >> 20;
    g[k] = (mrl_candidate){p[j], (int32_t)j};
    k += e == d;
    m[0] += p[j] * (float)((e > d) & (p[j] >= floor_p));
  }
  *n = k;
  return (m[0] + m[1]) + (m[2] + m[3]);
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
static int cut_digit(const bin *h, int64_t need, double target, int64_t *above,
                     double *above_mass) {
  for (int d = DIGITS - 1; d >= 0; d--) {
    if (*above + h[d].count >= need || *above_mass + h[d].mass >= target) return d;
    *above += h[d].count;
    *above_mass += h[d].mass;
  }
  return -1;
}

/* The reference's cut (top-k, then the shortest prefix reaching top_p * sum) found from h, the
 * histogram of the first digit of p (V tokens, sum their mass), using g (V entries)
 * for the groups. The reference adds the masses in sorted order, this in another order, so the
 * two sums can round differently: when all the probabilities are multiples of the smallest one's
 * last bit and the total stays below 2^52 of those, every sum is exact and both agree; otherwise
 * the cut is accepted only when the prefix masses on both sides of it are farther from the target
 * than any rounding of either sum. Returns -1 when it is not (the caller then sorts); otherwise
 * the number of tokens at the head of g, in id order, that hold every kept one (0 when they were
 * too many to gather). When they were, and digit d's tokens are few enough to keep beside their
 * copy (g[V - blocks..] holding block), *blocked is set and block[b] gets the kept mass (over
 * floor_p) of the ids in [b, b + 1) WALK_BLOCK, which the caller would compute otherwise. */
static int64_t find_cut(const float *p, int64_t V, const mrl_sampling *s, double sum,
                        bin *h, mrl_candidate *g, cut_point *out,
                        float floor_p, double *block, int64_t blocks, bool *blocked) {
  int64_t need = s->top_k > 0 && s->top_k < V ? s->top_k : V;
  bool top_p = s->top_p > 0.0f && s->top_p < 1.0f;
  double target = top_p ? s->top_p * sum : INFINITY;
  int lowest = 0;
  while (lowest < DIGITS && h[lowest].mass == 0.0) lowest++;
  /* digit 0 holds zeros and subnormals; digit d >= 8 the floats of exponent field d / 8 */
  bool exact = lowest >= 8 && ldexp(sum, 150 - lowest / 8) < 0x1p52;
  double bound = exact ? 0.0 : 4.0 * (double)(V + 4 * DIGITS) * DBL_EPSILON * sum;

  int64_t above = 0;
  double above_mass = 0.0;
  int d = cut_digit(h, need, target, &above, &above_mass);
  if (d < 0) { /* top-p alone and the whole vocabulary short of the target: all kept */
    if (!(above_mass < target - bound)) return -1;
    *out = (cut_point){0, INT32_MAX};
    return 0;
  }
  /* the tokens of digit d and above, when few (a copy of digit d's then follows them), or only
   * those of digit d */
  int64_t n = 0, gathered = 0, first_n = 0;
  const mrl_candidate *first = NULL; /* digit d's tokens, when the blocks are found here */
  if (2 * (above + h[d].count) <= V) {
    for (int64_t j = 0; j < V; j++) {
      g[gathered] = (mrl_candidate){p[j], (int32_t)j};
      gathered += (bits_of(p[j]) >> 20) >= (uint32_t)d;
    }
    for (int64_t k = 0; k < gathered; k++) {
      g[gathered + n] = g[k];
      n += (bits_of(g[k].p) >> 20) == (uint32_t)d;
    }
    g += gathered;
  } else if (2 * h[d].count + blocks <= V) {
    /* digit d's tokens and, block by block, the mass of those above it; the refinement works on a
     * copy, and the kept ones of digit d are added to their blocks at the end */
    for (int64_t b = 0; b < blocks; b++) {
      int64_t j0 = b * WALK_BLOCK, j1 = j0 + WALK_BLOCK < V ? j0 + WALK_BLOCK : V;
      block[b] = gather_digit(p, j0, j1, (uint32_t)d, floor_p, g, &n);
    }
    memcpy(g + n, g, sizeof *g * (size_t)n);
    first = g;
    first_n = n;
    g += n;
  } else {
    for (int64_t j = 0; j < V; j++) {
      g[n] = (mrl_candidate){p[j], (int32_t)j};
      n += (bits_of(p[j]) >> 20) == (uint32_t)d;
    }
  }
  for (int shift = 10; shift >= 0 && n > SMALL_GROUP; shift -= 10) {
    memset(h, 0, sizeof *h * DIGITS);
    for (int64_t i = 0; i < n; i++) {
      uint32_t e = (bits_of(g[i].p) >> shift) & (DIGITS - 1);
      h[e].count++;
      h[e].mass += g[i].p;
    }
    d = cut_digit(h, need, target, &above, &above_mass);
    if (d < 0) return -1; /* the group's mass fell short of what its sum promised: rounding */
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
  if (i == n && above < need && above_mass < target) return -1; /* rounding, as above */
  if (top_p && !(before < target - bound)) return -1;
  if (top_p && above < need && !(above_mass >= target + bound)) return -1;
  *out = (cut_point){bits_of(g[i - 1].p), g[i - 1].id};
  if (first) {
    for (int64_t k = 0; k < first_n; k++)
      if (kept_by(bits_of(first[k].p), first[k].id, *out) && first[k].p >= floor_p)
        block[first[k].id / WALK_BLOCK] += first[k].p;
    *blocked = true;
  }
  return gathered;
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
  float mx;
  int32_t best = allowed_argmax(z, V, allowed, &mx, bad);
  if (best < 0) return best;
  bool cut = s->temperature > 0.0f && ((s->top_k > 0 && s->top_k < V) ||
                                        (s->top_p > 0.0f && s->top_p < 1.0f));
  double sum = 0.0, over = 0.0;
  bin h[DIGITS];
  if (cut) { /* with the histogram of the first digit of p for find_cut (the same p and sum) */
    memset(h, 0, sizeof h);
    if (s->top_p > 0.0f && s->top_p < 1.0f) {
      /* a bucket's mass in units of its exponent's last bit: integer additions (a chain of
       * floating-point ones through memory would slow the loop down), and exact */
      int64_t units[DIGITS];
      memset(units, 0, sizeof units);
      for (int64_t j = 0; j < V; j++) {
        float q = !allowed || allowed[j] ? expf((z[j] - mx) / temp) : 0.0f;
        uint32_t b = bits_of(q), d = b >> 20;
        p[j] = q;
        sum += q;
        h[d].count++;
        units[d] += (b & 0x7FFFFF) | (uint32_t)(b >= 0x800000) << 23;
      }
      double unit = 0x1p-149; /* exponent fields 0 (subnormal) and 1 */
      for (int d = 0; d < DIGITS; d++) {
        if (d >= 16 && d % 8 == 0) unit *= 2.0;
        h[d].mass = (double)units[d] * unit;
      }
    } else { /* top-k alone needs no masses */
      for (int64_t j = 0; j < V; j++) {
        float q = !allowed || allowed[j] ? expf((z[j] - mx) / temp) : 0.0f;
        p[j] = q;
        sum += q;
        h[bits_of(q) >> 20].count++;
      }
    }
  } else {
    /* with the mass over the min-p floor (min_p times p[best] = 1), as the reference adds it */
    float floor_p = s->min_p;
    for (int64_t j = 0; j < V; j++) {
      float q = !allowed || allowed[j] ? expf((z[j] - mx) / temp) : 0.0f;
      p[j] = q;
      sum += q;
      over += q >= floor_p ? q : 0.0f;
    }
  }
  float log_sum = (float)log(sum);
  if (s->temperature <= 0.0f) {
    *logp = -log_sum; /* z[best] == mx */
    return best;
  }
  float floor_p = s->min_p > 0.0f ? s->min_p * p[best] : 0.0f;
  int32_t pick = best;
  double acc = 0.0;
  if (!cut) {
    /* every token, in id order, as the reference walks them; the kept mass is the same
     * additions in the same order as the reference's (adding 0 changes no sum) */
    double u = mrl__rng_uniform(rng) * (floor_p > 0.0f ? over : sum);
    for (int64_t j = 0; j < V; j++) { /* without branches on the floor: adding 0 changes no sum */
      bool keep = p[j] >= floor_p && (!allowed || allowed[j]);
      pick = keep ? (int32_t)j : pick;
      acc += keep ? p[j] : 0.0f;
      if (u < acc) break;
    }
    if (support) *support = -1;
  } else {
    cut_point c;
    int64_t blocks = (V + WALK_BLOCK - 1) / WALK_BLOCK, last = 0;
    double *block = (double *)(void *)(cand + V - blocks); /* the tail of the scratch */
    bool blocked = false;
    int64_t gathered = find_cut(p, V, s, sum, h, cand, &c, floor_p, block, blocks,
                                &blocked);
    if (gathered < 0) {
      c = sorted_cut(p, V, s, sum, cand);
      gathered = 0;
      blocked = false;
    }
    if (gathered > 0) { /* the kept tokens are among the few gathered, in id order */
      double kept = 0.0;
      for (int64_t k = 0; k < gathered; k++)
        if (keeps(cand[k].p, cand[k].id, c, floor_p, allowed)) kept += cand[k].p;
      double u = mrl__rng_uniform(rng) * kept;
      for (int64_t k = 0; k < gathered; k++) {
        if (!keeps(cand[k].p, cand[k].id, c, floor_p, allowed)) continue;
        pick = cand[k].id;
        acc += cand[k].p;
        if (u < acc) break;
      }
    } else {
      /* the kept mass of each block of ids, then the draw: whole blocks, then the ids of the
       * block it falls in */
      double kept = 0.0;
      for (int64_t b = 0; b < blocks; b++) {
        int64_t j0 = b * WALK_BLOCK, j1 = j0 + WALK_BLOCK < V ? j0 + WALK_BLOCK : V;
        if (!blocked) block[b] = kept_mass(p, j0, j1, c, floor_p, allowed);
        kept += block[b];
        if (block[b] > 0.0) last = b;
      }
      double u = mrl__rng_uniform(rng) * kept;
      int64_t b = 0;
      while (b < last && !(u < acc + block[b])) acc += block[b++];
      int64_t end = b * WALK_BLOCK + WALK_BLOCK < V ? b * WALK_BLOCK + WALK_BLOCK : V;
      for (int64_t j = b * WALK_BLOCK; j < end; j++) {
        if (!keeps(p[j], j, c, floor_p, allowed)) continue;
        pick = (int32_t)j;
        acc += p[j];
        if (u < acc) break;
      }
    }
    if (support) { /* for the tests: the kept set, in id order */
      int64_t n = 0;
      for (int64_t j = 0; j < V; j++)
        if (keeps(p[j], j, c, floor_p, allowed)) cand[n++] = (mrl_candidate){p[j], (int32_t)j};
      *support = n;
    }
  }
  *logp = (z[pick] - mx) / temp - log_sum;
  return pick;
}
