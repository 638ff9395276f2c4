/* test_head.c - the LM head's fast path (head.c: scored rows gathered a block at a time, the
 * vectorized exp, per-row work on the engine's threads) against its reference (every row through
 * the head, libm's exp in double, the calling thread): log-probabilities, entropies and every
 * parameter's gradient, with few or all rows scored, zero and non-zero coefficients, a vocabulary
 * that is not a multiple of the kernels' lanes, tied and untied heads, peaked logits whose
 * exponentials underflow; and the same bits for 1 and 3 threads. */
#include "model.h"
#include "support.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { B = 3, T = 90, N = B * T, VOCAB = 1031 };

typedef struct {
  int32_t tokens[N], lengths[B], targets[N];
  float g[N], gh[N];
} batch;

/* Rows scored with probability `share`; coefficients non-zero with probability 3/4 each. */
static batch make_batch(uint64_t seed, double share) {
  batch bt;
  struct mrl_rng r;
  mrl__rng_seed(&r, seed);
  bt.lengths[0] = T;
  bt.lengths[1] = 61;
  bt.lengths[2] = 1;
  for (int i = 0; i < N; i++) bt.tokens[i] = (int32_t)(mrl__rng_u64(&r) % VOCAB);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      int i = b * T + t;
      bool scored = t + 1 < bt.lengths[b] && mrl__rng_uniform(&r) < share;
      bt.targets[i] = scored ? bt.tokens[i + 1] : -1;
      bt.g[i] = mrl__rng_uniform(&r) < 0.75 ? (float)mrl__rng_normal(&r) : 0.0f;
      bt.gh[i] = mrl__rng_uniform(&r) < 0.75 ? (float)(0.3 * mrl__rng_normal(&r)) : 0.0f;
    }
  return bt;
}

static mrl_model *make_model(int tied, double scale, int threads) {
  mrl_engine *e = new_engine();
  MUST(mrl_engine_set_threads(e, threads));
  e->pool_min_work = 0;
  mrl_model_config c;
  mrl_model_config_default(&c);
  c.vocab = VOCAB;
  c.dim = 24;
  c.layers = 1;
  c.heads = 3;
  c.kv_heads = 1;
  c.ffn = 40;
  c.ctx = T;
  c.tie_embeddings = tied;
  mrl_model *m = NULL;
  MUST(mrl_model_new(e, &c, 5, &m));
  mrl_engine_free(e);
  int64_t head = m->lm_head, count = (int64_t)VOCAB * c.dim;
  for (int64_t k = 0; k < count; k++) m->weights[head + k] *= (float)scale;
  return m;
}

typedef struct {
  float logp[N], ent[N];
  float *grads;
} result;

static result run(mrl_model *m, const batch *bt, bool reference, bool with_g, bool with_gh) {
  result out;
  m->reference_head = reference;
  MUST(mrl_model_forward(m, bt->tokens, bt->lengths, B, T));
  MUST(mrl_model_score(m, bt->targets, out.logp, out.ent));
  MUST(mrl_model_zero_grad(m));
  MUST(mrl_model_backward(m, bt->targets, with_g ? bt->g : NULL, with_gh ? bt->gh : NULL));
  out.grads = malloc(sizeof(float) * (size_t)m->numel);
  memcpy(out.grads, m->grads, sizeof(float) * (size_t)m->numel);
  return out;
}

/* max |a - b| over the scored rows (and that unscored rows are exactly 0 in both) */
static double row_difference(const float *a, const float *b, const int32_t *targets) {
  double worst = 0.0;
  for (int i = 0; i < N; i++) {
    if (targets[i] < 0) {
      CHECKF(a[i] == 0.0f && b[i] == 0.0f, "unscored row %d: %g and %g", i, a[i], b[i]);
      continue;
    }
    worst = fmax(worst, fabs((double)a[i] - b[i]));
  }
  return worst;
}

/* max over parameters of max |a - b| / max |b| */
static double grad_difference(const mrl_model *m, const float *a, const float *b) {
  double worst = 0.0;
  for (int p = 0; p < m->nparams; p++) {
    const mrl_param *q = &m->params[p];
    double big = 1e-30, diff = 0.0;
    for (int64_t k = 0; k < q->numel; k++) {
      big = fmax(big, fabs(b[q->offset + k]));
      diff = fmax(diff, fabs((double)a[q->offset + k] - b[q->offset + k]));
    }
    worst = fmax(worst, diff / big);
  }
  return worst;
}

static void compare(const char *what, int tied, double scale, double share, bool with_g,
                    bool with_gh) {
  mrl_model *m = make_model(tied, scale, 3);
  batch bt = make_batch(11, share);
  result fast = run(m, &bt, false, with_g, with_gh);
  result ref = run(m, &bt, true, with_g, with_gh);
  double dl = row_difference(fast.logp, ref.logp, bt.targets);
  double de = row_difference(fast.ent, ref.ent, bt.targets);
  double dg = grad_difference(m, fast.grads, ref.grads);
  int scored = 0;
  for (int i = 0; i < N; i++) scored += bt.targets[i] >= 0;
  check_note("%s (%d of %d rows scored): logp %.2e, entropy %.2e, gradients %.2e of the largest",
             what, scored, N, dl, de, dg);
  CHECKF(dl < 2e-5 && de < 2e-5, "%s: scores differ", what);
  CHECKF(dg < 2e-5, "%s: gradients differ", what);
  /* the gradients are not all zero when a coefficient is given */
  double any = 0.0;
  for (int64_t k = 0; k < m->numel; k++) any += fabs(fast.grads[k]);
  CHECKF((with_g || with_gh) == (any > 0.0), "%s: gradient sum %g", what, any);
  free(fast.grads);
  free(ref.grads);
  mrl_model_free(m);
}

static void test_few_rows_scored(void) { compare("14% scored, untied", 0, 1.0, 0.14, true, true); }
static void test_all_rows_scored(void) { compare("every scorable row, tied", 1, 1.0, 1.0, true, true); }
static void test_logp_coefficient_only(void) {
  compare("log p only, untied", 0, 1.0, 0.5, true, false);
}
static void test_entropy_coefficient_only(void) {
  compare("entropy only, tied", 1, 1.0, 0.5, false, true);
}
static void test_no_coefficients(void) { compare("no coefficients", 0, 1.0, 0.5, false, false); }
/* head weights x 40: logits spread over hundreds, most exponentials underflow to 0 */
static void test_peaked_logits(void) { compare("peaked logits, untied", 0, 40.0, 0.3, true, true); }

/* The fast path gives the same bits on 1 and on 3 threads. */
static void test_threads_same_bits(void) {
  batch bt = make_batch(12, 0.3);
  mrl_model *one = make_model(0, 1.0, 1), *three = make_model(0, 1.0, 3);
  result a = run(one, &bt, false, true, true), b = run(three, &bt, false, true, true);
  CHECK(memcmp(a.logp, b.logp, sizeof a.logp) == 0);
  CHECK(memcmp(a.ent, b.ent, sizeof a.ent) == 0);
  CHECK(memcmp(a.grads, b.grads, sizeof(float) * (size_t)one->numel) == 0);
  free(a.grads);
  free(b.grads);
  mrl_model_free(one);
  mrl_model_free(three);
}

static const test_case tests[] = {{"few_rows_scored", test_few_rows_scored},
                                  {"all_rows_scored", test_all_rows_scored},
                                  {"logp_coefficient_only", test_logp_coefficient_only},
                                  {"entropy_coefficient_only", test_entropy_coefficient_only},
                                  {"no_coefficients", test_no_coefficients},
                                  {"peaked_logits", test_peaked_logits},
                                  {"threads_same_bits", test_threads_same_bits},
                                  {NULL, NULL}};

int main(int argc, char **argv) { return check_main(argc, argv, tests); }
