/* test_sampling.c - the draw of one token (mrl__sample_one: top-k / top-p cut by partial selection,
 * kept set walked in id order) against the sort-based reference (mrl__sample_one_ref): the same
 * kept set with the same probabilities on random, tied, underflowing and all-equal rows of odd
 * vocabulary sizes, with and without an allowed mask; the same draws, log-probabilities and
 * random streams as the reference for greedy, plain and min-p-only sampling; log-probabilities of
 * every draw; and the frequencies of many draws against the kept distribution. */
#include "model.h"
#include "support.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ROW_KINDS = 6 };
static const char *const row_kind_name[ROW_KINDS] = {"normal",  "peaked", "ties",
                                                     "negative", "equal", "near-cut"};

/* A row of logits: N(0, 1); N(0, 1) with one large logit and a spread (peaked); few distinct
 * values (ties); half of them very negative (probabilities that underflow to 0 or subnormals);
 * all equal; or four equal logits and far smaller ones (top-p targets that fall on a prefix mass
 * up to rounding). */
static void make_row(float *z, int64_t V, int kind, uint64_t seed) {
  struct mrl_rng r;
  mrl__rng_seed(&r, seed);
  for (int64_t j = 0; j < V; j++) {
    double x = mrl__rng_normal(&r);
    switch (kind) {
    case 0: z[j] = (float)x; break;
    case 1: z[j] = (float)(3.0 * x) + (j == V / 3 ? 12.0f : 0.0f); break;
    case 2: z[j] = (float)(mrl__rng_u64(&r) % 4) * 0.5f; break;
    case 3: z[j] = mrl__rng_u64(&r) % 2 ? (float)(-1e4 + x * 40.0) : (float)x; break;
    case 4: z[j] = 0.25f; break;
    default: z[j] = j % 7 < 4 ? 1.0f : (float)(-70.0 + x); break;
    }
  }
}

typedef struct {
  int32_t token;
  float logp;
  struct mrl_rng rng;
  int64_t support;
} draw;

/* Scratch for both functions, and the kept sets they report, as probabilities indexed by id. */
typedef struct {
  int64_t V;
  float *p_ref, *p_fast;
  mrl_candidate *order, *cand;
  double *q_ref, *q_fast; /* kept probability of each id (0 when not kept) */
  uint8_t *in_ref, *in_fast;
} bench;

static bench bench_new(int64_t V) {
  bench b = {V,
             malloc(sizeof(float) * (size_t)V),
             malloc(sizeof(float) * (size_t)V),
             malloc(sizeof(mrl_candidate) * (size_t)V),
             malloc(sizeof(mrl_candidate) * (size_t)V),
             malloc(sizeof(double) * (size_t)V),
             malloc(sizeof(double) * (size_t)V),
             malloc((size_t)V),
             malloc((size_t)V)};
  if (!b.p_ref || !b.p_fast || !b.order || !b.cand || !b.q_ref || !b.q_fast || !b.in_ref ||
      !b.in_fast) {
    printf("Bail out! out of memory\n");
    exit(1);
  }
  return b;
}

static void bench_free(bench *b) {
  free(b->p_ref);
  free(b->p_fast);
  free(b->order);
  free(b->cand);
  free(b->q_ref);
  free(b->q_fast);
  free(b->in_ref);
  free(b->in_fast);
}

static draw draw_with(bool fast, bench *b, const float *z, const mrl_sampling *s,
                      const uint8_t *allowed, uint64_t seed) {
  draw d = {0};
  mrl__rng_seed(&d.rng, seed);
  d.support = -2;
  int64_t bad = -1;
  d.token = fast ? mrl__sample_one(z, b->V, s, allowed, &d.rng, b->p_fast, b->cand, &d.logp, &bad,
                                   &d.support)
                 : mrl__sample_one_ref(z, b->V, s, allowed, &d.rng, b->p_ref, b->order, &d.logp,
                                       &bad, &d.support);
  return d;
}

/* The kept set a draw reported, as membership and normalised probability by id (see
 * mrl__sample_one's support). */
static void kept_set(const bench *b, bool fast, const draw *d, const mrl_sampling *s,
                     const uint8_t *allowed, uint8_t *in, double *q) {
  const float *p = fast ? b->p_fast : b->p_ref;
  const mrl_candidate *c = fast ? b->cand : b->order;
  float top = 0.0f;
  for (int64_t j = 0; j < b->V; j++) top = fmaxf(top, p[j]);
  float floor_p = s->min_p > 0.0f ? s->min_p * top : 0.0f;
  memset(in, 0, (size_t)b->V);
  if (d->support < 0) {
    for (int64_t j = 0; j < b->V; j++) in[j] = 1;
  } else {
    for (int64_t k = 0; k < d->support; k++) in[c[k].id] = 1;
  }
  double total = 0.0;
  for (int64_t j = 0; j < b->V; j++) {
    if (p[j] < floor_p || (allowed && !allowed[j])) in[j] = 0;
    if (in[j]) total += p[j];
  }
  for (int64_t j = 0; j < b->V; j++) q[j] = in[j] ? p[j] / total : 0.0;
}

/* Compares one configuration on one row; returns the number of mismatches (also recorded). */
static int compare_one(bench *b, const float *z, const mrl_sampling *s, const uint8_t *allowed,
                       uint64_t seed, const char *what) {
  draw r = draw_with(false, b, z, s, allowed, seed);
  draw f = draw_with(true, b, z, s, allowed, seed);
  int bad = 0;
  if (!CHECKF(r.token == f.token || s->temperature > 0.0f, "%s: greedy %d vs %d", what, r.token,
              f.token))
    return 1;
  if (s->temperature <= 0.0f) {
    bad += !CHECKF(f.logp == r.logp, "%s: greedy log-prob %.9g vs %.9g", what, f.logp, r.logp);
    return bad;
  }
  bad += !CHECKF(!memcmp(b->p_ref, b->p_fast, sizeof(float) * (size_t)b->V),
                 "%s: probabilities differ", what);
  kept_set(b, false, &r, s, allowed, b->in_ref, b->q_ref);
  kept_set(b, true, &f, s, allowed, b->in_fast, b->q_fast);
  int64_t differ = 0, first = -1, kept = 0;
  double worst = 0.0;
  for (int64_t j = 0; j < b->V; j++) {
    kept += b->in_ref[j];
    if (b->in_ref[j] != b->in_fast[j]) {
      if (first < 0) first = j;
      differ++;
    }
    worst = fmax(worst, fabs(b->q_ref[j] - b->q_fast[j]) / fmax(b->q_ref[j], 1e-300));
  }
  bad += !CHECKF(differ == 0, "%s: kept sets differ at %lld ids (first %lld; reference keeps %lld)",
                 what, (long long)differ, (long long)first, (long long)kept);
  bad += !CHECKF(worst <= 1e-12, "%s: kept probabilities differ by %.3g (relative)", what, worst);
  bad += !CHECKF(f.token >= 0 && f.token < b->V && b->in_fast[f.token] &&
                     (!allowed || allowed[f.token]),
                 "%s: drew %d, which is not kept", what, f.token);
  /* the returned log-probability: the token's under the temperature-scaled distribution */
  if (f.token >= 0 && f.token < b->V) {
    float temp = s->temperature, mx = -INFINITY;
    double sum = 0.0;
    for (int64_t j = 0; j < b->V; j++)
      if (!allowed || allowed[j]) mx = fmaxf(mx, z[j]);
    for (int64_t j = 0; j < b->V; j++) sum += b->p_ref[j];
    float want = (z[f.token] - mx) / temp - (float)log(sum);
    bad += !CHECKF(f.logp == want, "%s: log-prob of %d is %.9g, want %.9g", what, f.token, f.logp,
                   want);
  }
  if (r.token == f.token) bad += !CHECKF(r.logp == f.logp, "%s: same token, other log-prob", what);
  bool by_id = !(s->top_k > 0 && s->top_k < b->V) && !(s->top_p > 0.0f && s->top_p < 1.0f);
  if (by_id) /* plain and min-p-only: the reference walks in id order too: the same draw */
    bad += !CHECKF(r.token == f.token && r.logp == f.logp &&
                       !memcmp(r.rng.s, f.rng.s, sizeof r.rng.s),
                   "%s: plain draw %d (%.9g) vs reference %d (%.9g)", what, f.token, f.logp,
                   r.token, r.logp);
  return bad;
}

static const float temps[] = {0.0f, 0.7f, 1.0f, 2.0f};
static const float top_ps[] = {0.0f, 1e-6f, 0.5f, 0.9f, 0.999f, 1.0f};
static const float min_ps[] = {0.0f, 0.05f};

/* Every configuration on every row kind of vocabulary V, with masks: none, a random third, one
 * token. full: every top-k / top-p / min-p / temperature combination (small V), otherwise a
 * sample of them. */
static void compare_vocab(int64_t V, bool full) {
  bench b = bench_new(V);
  float *z = malloc(sizeof(float) * (size_t)V);
  uint8_t *mask = malloc((size_t)V), *one = calloc((size_t)V, 1);
  if (!z || !mask || !one) {
    printf("Bail out! out of memory\n");
    exit(1);
  }
  struct mrl_rng r;
  mrl__rng_seed(&r, 77 + (uint64_t)V);
  for (int64_t j = 0; j < V; j++) mask[j] = mrl__rng_u64(&r) % 3 == 0;
  mask[V - 1] = 1;
  one[V / 2] = 1;
  int top_ks[] = {0, 1, 2, (int)(V > 1 ? V - 1 : 1), (int)V, (int)V + 5};
  int cases = 0, failures = 0, config = 0;
  for (int kind = 0; kind < ROW_KINDS; kind++) {
    make_row(z, V, kind, 1000 + (uint64_t)kind);
    for (int m = 0; m < 3; m++) {
      const uint8_t *allowed = m == 0 ? NULL : m == 1 ? mask : one;
      for (int t = 0; t < 4; t++)
        for (int k = 0; k < 6; k++)
          for (int pp = 0; pp < 6; pp++)
            for (int mp = 0; mp < 2; mp++) {
              if (!full && (config++ % 7) != 0) continue;
              if (temps[t] <= 0.0f && (k || pp || mp)) continue; /* greedy ignores the rest */
              mrl_sampling s = {temps[t], top_ks[k], top_ps[pp], min_ps[mp]};
              char what[160];
              snprintf(what, sizeof what,
                       "V %lld, %s row, mask %d, temperature %g, top-k %d, top-p %g, min-p %g",
                       (long long)V, row_kind_name[kind], m, (double)s.temperature, s.top_k,
                       (double)s.top_p, (double)s.min_p);
              cases++;
              failures += compare_one(&b, z, &s, allowed, 31 * (uint64_t)cases + 5, what) > 0;
              if (failures > 5) goto done;
            }
    }
  }
done:
  check_note("V %lld: %d configurations, %d differ", (long long)V, cases, failures);
  free(z);
  free(mask);
  free(one);
  bench_free(&b);
}

static void test_small_vocabularies(void) {
  compare_vocab(1, true);
  compare_vocab(2, true);
  compare_vocab(7, true);
}

static void test_vocab_1000(void) { compare_vocab(1000, true); }
static void test_vocab_4099(void) { compare_vocab(4099, false); }

/* The Qwen vocabulary: the main configurations on a normal and a peaked row. */
static void test_vocab_151936(void) {
  const int64_t V = 151936;
  bench b = bench_new(V);
  float *z = malloc(sizeof(float) * (size_t)V);
  if (!z) {
    printf("Bail out! out of memory\n");
    exit(1);
  }
  const mrl_sampling modes[] = {{1.0f, 0, 1.0f, 0.0f},  {1.0f, 50, 1.0f, 0.0f},
                                {1.0f, 0, 0.9f, 0.0f},  {0.7f, 50, 0.9f, 0.0f},
                                {1.0f, 0, 1.0f, 0.05f}, {2.0f, 1000, 0.95f, 0.01f},
                                {0.0f, 0, 1.0f, 0.0f}};
  int n = (int)(sizeof modes / sizeof modes[0]);
  for (int kind = 0; kind < 2; kind++) {
    make_row(z, V, kind, 500 + (uint64_t)kind);
    for (int i = 0; i < n; i++) {
      char what[96];
      snprintf(what, sizeof what, "V 151936, %s row, mode %d", row_kind_name[kind], i);
      compare_one(&b, z, &modes[i], NULL, 9 + (uint64_t)i, what);
    }
  }
  free(z);
  bench_free(&b);
}

/* Many draws of one small case under top-k and top-p: each token's frequency against the kept
 * distribution of the reference (a chi-square statistic far above its degrees of freedom means
 * the walk does not draw what it keeps). */
static void test_frequencies(void) {
  enum { V = 12, DRAWS = 200000 };
  float z[V];
  for (int j = 0; j < V; j++) z[j] = (float)((j * 7) % V) * 0.3f - 1.0f;
  const mrl_sampling modes[] = {{1.0f, 6, 1.0f, 0.0f}, {0.8f, 0, 0.9f, 0.0f},
                                {1.3f, 8, 0.95f, 0.1f}};
  bench b = bench_new(V);
  for (int m = 0; m < 3; m++) {
    draw r = draw_with(false, &b, z, &modes[m], NULL, 1);
    kept_set(&b, false, &r, &modes[m], NULL, b.in_ref, b.q_ref);
    long count[V] = {0};
    struct mrl_rng rng;
    mrl__rng_seed(&rng, 4242 + (uint64_t)m);
    for (int i = 0; i < DRAWS; i++) {
      float lp;
      int64_t bad = -1;
      int32_t t = mrl__sample_one(z, V, &modes[m], NULL, &rng, b.p_fast, b.cand, &lp, &bad, NULL);
      if (t >= 0 && t < V) count[t]++;
    }
    double chi2 = 0.0;
    int df = -1;
    long outside = 0;
    for (int j = 0; j < V; j++) {
      if (b.in_ref[j]) {
        double want = b.q_ref[j] * DRAWS;
        chi2 += (count[j] - want) * (count[j] - want) / want;
        df++;
      } else {
        outside += count[j];
      }
    }
    check_note("mode %d: %d kept tokens, chi-square %.1f on %d degrees of freedom", m, df + 1,
               chi2, df);
    CHECKF(outside == 0, "mode %d: %ld draws outside the kept set", m, outside);
    /* mean df, standard deviation sqrt(2 df): 8 deviations is far beyond chance */
    CHECKF(df >= 2 && chi2 < df + 8.0 * sqrt(2.0 * df), "mode %d: chi-square %.1f (df %d)", m,
           chi2, df);
  }
  bench_free(&b);
}

/* Rows that are cheap for selection only if ties are handled in linear time: all equal, and
 * almost all zero (probabilities underflowed), at the Qwen vocabulary, against the reference. */
static void test_degenerate_rows(void) {
  const int64_t V = 151936;
  bench b = bench_new(V);
  float *z = malloc(sizeof(float) * (size_t)V);
  if (!z) {
    printf("Bail out! out of memory\n");
    exit(1);
  }
  const mrl_sampling modes[] = {{1.0f, 50, 1.0f, 0.0f},
                                {1.0f, 0, 0.5f, 0.0f},
                                {1.0f, (int)V - 1, 0.9f, 0.0f},
                                {1.0f, 100000, 0.999f, 0.0f}};
  for (int kind = 0; kind < 2; kind++) {
    for (int64_t j = 0; j < V; j++) z[j] = kind == 0 ? 1.5f : j % 1000 == 3 ? 0.0f : -200.0f;
    for (int i = 0; i < 4; i++) {
      char what[64];
      snprintf(what, sizeof what, "%s row, mode %d", kind == 0 ? "equal" : "zeros", i);
      compare_one(&b, z, &modes[i], NULL, 3 + (uint64_t)i, what);
    }
  }
  free(z);
  bench_free(&b);
}

static const test_case tests[] = {
    {"small_vocabularies", test_small_vocabularies},
    {"vocab_1000", test_vocab_1000},
    {"vocab_4099", test_vocab_4099},
    {"vocab_151936", test_vocab_151936},
    {"degenerate_rows", test_degenerate_rows},
    {"frequencies", test_frequencies},
    {NULL, NULL}};

int main(int argc, char **argv) { return check_main(argc, argv, tests); }
