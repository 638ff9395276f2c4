/* test_model.c - the policy model's maths: finite-difference checks of every parameter's gradient
 * (Llama, Qwen2-style biases + GQA + untied head, Qwen3-style q/k norms with a wide head_dim),
 * padding isolation, batch-composition independence, score/logits agreement, AdamW and the
 * learning-rate schedules against independent references, argument errors, and allocation
 * failures in forward, score and backward that change nothing. */
#include "model.h"
#include "support.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { B = 2, T = 5 };

static mrl_model_config tiny(const char *kind) {
  mrl_model_config c;
  mrl_model_config_default(&c);
  c.vocab = 11;
  c.dim = 8;
  c.layers = 2;
  c.heads = 2;
  c.kv_heads = 2;
  c.ffn = 12;
  c.ctx = 8;
  if (!strcmp(kind, "qwen2")) {
    c.kv_heads = 1;
    c.qkv_bias = 1;
    c.tie_embeddings = 0;
  } else if (!strcmp(kind, "qwen3")) {
    c.kv_heads = 1;
    c.qk_norm = 1;
    c.head_dim = 6; /* not dim / heads */
    c.tie_embeddings = 0;
  }
  return c;
}

/* A model whose weights are large enough for every path to matter: matrices ~ N(0, 0.3),
 * norm weights ~ 1 + N(0, 0.2), biases ~ N(0, 0.2). */
static mrl_model *test_model(const char *kind, uint64_t seed) {
  mrl_engine *e = new_engine();
  mrl_model_config c = tiny(kind);
  mrl_model *m = NULL;
  MUST(mrl_model_new(e, &c, seed, &m));
  mrl_engine_free(e); /* the model keeps it */
  struct mrl_rng r;
  mrl__rng_seed(&r, seed + 1);
  for (int i = 0; i < m->nparams; i++) {
    mrl_param *p = &m->params[i];
    bool norm = strstr(p->name, "norm") != NULL;
    for (int64_t k = 0; k < p->numel; k++)
      m->weights[p->offset + k] =
          (float)((norm ? 1.0 : 0.0) + (p->rank == 2 ? 0.3 : 0.2) * mrl__rng_normal(&r));
  }
  return m;
}

typedef struct {
  int32_t tokens[B * T], lengths[B], targets[B * T];
  float coef_logp[B * T], coef_ent[B * T];
} batch;

static batch test_batch(uint64_t seed) {
  batch bt;
  struct mrl_rng r;
  mrl__rng_seed(&r, seed);
  bt.lengths[0] = T;
  bt.lengths[1] = 3;
  for (int i = 0; i < B * T; i++) {
    bt.tokens[i] = (int32_t)(mrl__rng_u64(&r) % 11);
    bt.coef_logp[i] = (float)mrl__rng_normal(&r);
    bt.coef_ent[i] = (float)(0.5 * mrl__rng_normal(&r));
  }
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      bt.targets[b * T + t] = t + 1 < bt.lengths[b] ? bt.tokens[b * T + t + 1] : -1;
  return bt;
}

/* L = sum_i coef_logp[i] logp_i + coef_ent[i] H_i, in double. */
static double loss_of(mrl_model *m, const batch *bt) {
  float logp[B * T], ent[B * T];
  MUST(mrl_model_forward(m, bt->tokens, bt->lengths, B, T));
  MUST(mrl_model_score(m, bt->targets, logp, ent));
  double l = 0.0;
  for (int i = 0; i < B * T; i++) l += (double)bt->coef_logp[i] * logp[i] + (double)bt->coef_ent[i] * ent[i];
  return l;
}

static void check_gradients(const char *kind) {
  mrl_model *m = test_model(kind, 7);
  batch bt = test_batch(3);
  MUST(mrl_model_zero_grad(m));
  MUST(mrl_model_forward(m, bt.tokens, bt.lengths, B, T));
  MUST(mrl_model_backward(m, bt.targets, bt.coef_logp, bt.coef_ent));
  float *analytic = malloc(sizeof(float) * (size_t)m->numel);
  memcpy(analytic, m->grads, sizeof(float) * (size_t)m->numel);
  const float h = 1e-3f;
  int bad = 0;
  for (int i = 0; i < m->nparams; i++) {
    const mrl_param *p = &m->params[i];
    double worst = 0.0, scale = 0.0;
    for (int64_t k = 0; k < p->numel; k++) {
      float *w = &m->weights[p->offset + k], saved = *w;
      *w = saved + h;
      double up = loss_of(m, &bt);
      *w = saved - h;
      double down = loss_of(m, &bt);
      *w = saved;
      double numeric = (up - down) / (2.0 * (double)h), a = analytic[p->offset + k];
      double err = fabs(numeric - a);
      if (err > 2e-3 + 2e-2 * fmax(fabs(numeric), fabs(a))) {
        if (bad++ < 8)
          CHECKF(0, "%s %s[%lld]: analytic %.6g, numeric %.6g", kind, p->name, (long long)k, a,
                 numeric);
      }
      if (err > worst) worst = err;
      if (fabs(numeric) > scale) scale = fabs(numeric);
    }
    check_note("%s %-40s max |analytic - numeric| %.2e (largest gradient %.2e)", kind, p->name,
               worst, scale);
  }
  CHECKF(bad == 0, "%s: %d gradient entries disagree with finite differences", kind, bad);
  free(analytic);
  mrl_model_free(m);
}

static void test_gradients_llama(void) { check_gradients("llama"); }
static void test_gradients_qwen2(void) { check_gradients("qwen2"); }
static void test_gradients_qwen3(void) { check_gradients("qwen3"); }

/* mrl_model_hidden / mrl_model_backward_hidden: L = sum_i coef_logp[i] logp_i + sum c . h over
 * the final hidden states (a head of one's own, such as a critic's); every parameter's gradient
 * against finite differences. */
static double hidden_loss(mrl_model *m, const batch *bt, const float *ch) {
  double l = loss_of(m, bt); /* runs the forward */
  const float *h = mrl_model_hidden(m);
  for (int i = 0; i < B * T * m->cfg.dim; i++) l += (double)ch[i] * h[i];
  return l;
}

static void test_hidden_states_gradient(void) {
  mrl_model *m = test_model("qwen2", 9);
  CHECK(mrl_model_hidden(m) == NULL); /* no forward yet */
  CHECK(mrl_model_hidden(NULL) == NULL);
  CHECK(mrl_model_backward_hidden(NULL, NULL, NULL, NULL, NULL) == MRL_ERR_NULL);
  batch bt = test_batch(5);
  for (int i = 0; i < B * T; i++) bt.coef_ent[i] = 0.0f;
  int n = B * T * m->cfg.dim;
  float *ch = malloc(sizeof(float) * (size_t)n);
  struct mrl_rng r;
  mrl__rng_seed(&r, 77);
  for (int i = 0; i < n; i++) {
    int cell = i / m->cfg.dim; /* padding positions carry no loss: their states are not real */
    ch[i] = cell % T < bt.lengths[cell / T] ? (float)mrl__rng_normal(&r) : 0.0f;
  }
  MUST(mrl_model_zero_grad(m));
  MUST(mrl_model_forward(m, bt.tokens, bt.lengths, B, T));
  CHECK(mrl_model_hidden(m) != NULL);
  MUST(mrl_model_backward_hidden(m, bt.targets, bt.coef_logp, NULL, ch));
  float *analytic = malloc(sizeof(float) * (size_t)m->numel);
  memcpy(analytic, m->grads, sizeof(float) * (size_t)m->numel);
  const float h = 1e-3f;
  int bad = 0;
  double worst = 0.0;
  for (int64_t k = 0; k < m->numel; k += 3) {
    float *w = &m->weights[k], saved = *w;
    *w = saved + h;
    double up = hidden_loss(m, &bt, ch);
    *w = saved - h;
    double down = hidden_loss(m, &bt, ch);
    *w = saved;
    double numeric = (up - down) / (2.0 * (double)h), a = analytic[k];
    double err = fabs(numeric - a);
    if (err > 2e-3 + 2e-2 * fmax(fabs(numeric), fabs(a)) && bad++ < 8)
      CHECKF(0, "weight %lld: analytic %.6g, numeric %.6g", (long long)k, a, numeric);
    if (err > worst) worst = err;
  }
  check_note("hidden-state loss: max |analytic - numeric| %.2e over every third weight", worst);
  CHECK(bad == 0);
  free(analytic);
  free(ch);
  mrl_model_free(m);
}

/* Every parameter must receive some gradient (a path left out would show as zeros). */
static void test_every_parameter_gets_gradient(void) {
  const char *kinds[] = {"llama", "qwen2", "qwen3"};
  for (int k = 0; k < 3; k++) {
    mrl_model *m = test_model(kinds[k], 11);
    batch bt = test_batch(5);
    MUST(mrl_model_zero_grad(m));
    MUST(mrl_model_forward(m, bt.tokens, bt.lengths, B, T));
    MUST(mrl_model_backward(m, bt.targets, bt.coef_logp, bt.coef_ent));
    for (int i = 0; i < m->nparams; i++) {
      const mrl_param *p = &m->params[i];
      double ss = 0.0;
      for (int64_t j = 0; j < p->numel; j++) ss += fabs(m->grads[p->offset + j]);
      CHECKF(ss > 0.0, "%s: %s has an all-zero gradient", kinds[k], p->name);
    }
    mrl_model_free(m);
  }
}

/* Changing tokens past a sequence's length changes none of its scores; a sequence scores the
 * same alone as in a batch. */
static void test_padding_and_batch_independence(void) {
  mrl_model *m = test_model("qwen2", 13);
  batch bt = test_batch(9);
  float base[B * T], other[B * T], alone[T];
  MUST(mrl_model_forward(m, bt.tokens, bt.lengths, B, T));
  MUST(mrl_model_score(m, bt.targets, base, NULL));
  batch noisy = bt;
  for (int t = bt.lengths[1]; t < T; t++) noisy.tokens[T + t] = (noisy.tokens[T + t] + 5) % 11;
  MUST(mrl_model_forward(m, noisy.tokens, noisy.lengths, B, T));
  MUST(mrl_model_score(m, noisy.targets, other, NULL));
  for (int i = 0; i < B * T; i++) CHECKF(base[i] == other[i], "padding changed score %d", i);
  /* sequence 1 alone, as a batch of one with T = its length */
  int32_t len = bt.lengths[1];
  MUST(mrl_model_forward(m, bt.tokens + T, &len, 1, len));
  MUST(mrl_model_score(m, bt.targets + T, alone, NULL));
  double worst = 0.0;
  for (int t = 0; t < len; t++) worst = fmax(worst, fabs(alone[t] - base[T + t]));
  check_note("alone vs batched: max |difference| %.2e", worst);
  CHECK(worst < 1e-5);
  mrl_model_free(m);
}

/* mrl_model_score agrees with log_softmax of mrl_model_logits, and the entropy with its
 * definition, computed here in double. */
static void test_score_matches_logits(void) {
  mrl_model *m = test_model("qwen3", 17);
  batch bt = test_batch(4);
  float logp[B * T], ent[B * T];
  MUST(mrl_model_forward(m, bt.tokens, bt.lengths, B, T));
  MUST(mrl_model_score(m, bt.targets, logp, ent));
  mrl_tensor *logits = NULL;
  MUST(mrl_model_logits(m, &logits));
  const float *z = mrl_tensor_data(logits);
  double worst = 0.0;
  for (int i = 0; i < B * T; i++) {
    if (bt.targets[i] < 0) {
      CHECK(logp[i] == 0.0f && ent[i] == 0.0f);
      continue;
    }
    const float *row = z + i * 11;
    double mx = row[0], sum = 0.0, h = 0.0;
    for (int j = 1; j < 11; j++) mx = fmax(mx, row[j]);
    for (int j = 0; j < 11; j++) sum += exp(row[j] - mx);
    double lse = mx + log(sum);
    for (int j = 0; j < 11; j++) {
      double lp = row[j] - lse;
      h -= exp(lp) * lp;
    }
    worst = fmax(worst, fabs(logp[i] - (row[bt.targets[i]] - lse)));
    worst = fmax(worst, fabs(ent[i] - h));
  }
  check_note("score vs logits: max |difference| %.2e", worst);
  CHECK(worst < 1e-5);
  mrl_tensor_free(logits);
  mrl_model_free(m);
}

/* Three AdamW steps against a double-precision reference of the same update; weight decay on
 * matrices only; clipping scales the gradients to the norm asked for. */
static void test_adamw_and_clipping(void) {
  mrl_model *m = test_model("qwen2", 19);
  int64_t n = m->numel;
  double *w = malloc(sizeof(double) * (size_t)n), *mo = calloc((size_t)n, sizeof(double)),
         *vo = calloc((size_t)n, sizeof(double));
  for (int64_t i = 0; i < n; i++) w[i] = m->weights[i];
  mrl_adamw opt = {.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  batch bt = test_batch(21);
  double worst = 0.0;
  for (int step = 1; step <= 3; step++) {
    MUST(mrl_model_zero_grad(m));
    MUST(mrl_model_forward(m, bt.tokens, bt.lengths, B, T));
    MUST(mrl_model_backward(m, bt.targets, bt.coef_logp, NULL));
    double norm;
    MUST(mrl_model_clip_grad(m, 0.5, &norm));
    double after = 0.0;
    for (int64_t i = 0; i < n; i++) after += (double)m->grads[i] * m->grads[i];
    CHECKF(norm <= 0.5 || fabs(sqrt(after) - 0.5) < 1e-4, "clipped norm %.6f (was %.6f)",
           sqrt(after), norm);
    /* reference update from the same (clipped) gradients, in double */
    for (int i = 0; i < m->nparams; i++) {
      const mrl_param *p = &m->params[i];
      for (int64_t k = p->offset; k < p->offset + p->numel; k++) {
        double g = m->grads[k];
        if (p->decay) w[k] *= 1.0 - (double)opt.lr * opt.weight_decay;
        mo[k] = opt.beta1 * mo[k] + (1.0 - opt.beta1) * g;
        vo[k] = opt.beta2 * vo[k] + (1.0 - opt.beta2) * g * g;
        double mhat = mo[k] / (1.0 - pow(opt.beta1, step));
        double vhat = vo[k] / (1.0 - pow(opt.beta2, step));
        w[k] -= opt.lr * mhat / (sqrt(vhat) + opt.eps);
      }
    }
    MUST(mrl_model_adamw_step(m, &opt));
    for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs(w[i] - m->weights[i]));
  }
  check_note("AdamW vs double reference after 3 steps: max |difference| %.2e", worst);
  CHECK(worst < 1e-5);
  /* the forward's activations are stale after a step */
  CHECK_FAILS(m->engine, MRL_ERR_INVALID, "call mrl_model_forward first",
              mrl_model_backward(m, bt.targets, bt.coef_logp, NULL));
  free(w);
  free(mo);
  free(vo);
  mrl_model_free(m);
}

static void test_lr_schedules(void) {
  CHECK(mrl_lr_at(MRL_LR_CONSTANT, 50, 100, 0, 1e-3, 0) == 1e-3);
  CHECK(fabs(mrl_lr_at(MRL_LR_CONSTANT, 0, 100, 10, 1e-3, 0) - 1e-4) < 1e-15);
  CHECK(fabs(mrl_lr_at(MRL_LR_COSINE, 9, 100, 10, 1e-3, 0) - 1e-3) < 1e-15);
  CHECK(fabs(mrl_lr_at(MRL_LR_COSINE, 10, 100, 10, 1e-3, 1e-4) - 1e-3) < 1e-15);
  double mid = 1e-4 + 0.5 * (1e-3 - 1e-4) * (1.0 + cos(3.14159265358979323846 * 0.5));
  CHECK(fabs(mrl_lr_at(MRL_LR_COSINE, 55, 100, 10, 1e-3, 1e-4) - mid) < 1e-15);
  CHECK(fabs(mrl_lr_at(MRL_LR_COSINE, 100, 100, 10, 1e-3, 1e-4) - 1e-4) < 1e-15);
  CHECK(fabs(mrl_lr_at(MRL_LR_COSINE, 500, 100, 10, 1e-3, 1e-4) - 1e-4) < 1e-15);
}

static void test_errors(void) {
  mrl_engine *e = new_engine();
  mrl_model_config c = tiny("llama");
  mrl_model *m = NULL;
  mrl_model_config bad = c;
  bad.kv_heads = 3;
  CHECK_FAILS(e, MRL_ERR_INVALID, "kv_heads (3) must divide heads (2)", mrl_model_new(e, &bad, 1, &m));
  bad = c;
  bad.dim = 0;
  CHECK_FAILS(e, MRL_ERR_INVALID, "dim must be positive", mrl_model_new(e, &bad, 1, &m));
  bad = c;
  bad.head_dim = 3;
  CHECK_FAILS(e, MRL_ERR_INVALID, "head_dim must be even", mrl_model_new(e, &bad, 1, &m));
  CHECK(m == NULL);
  CHECK_FAILS(e, MRL_ERR_NULL, "cfg is NULL", mrl_model_new(e, NULL, 1, &m));
  MUST(mrl_model_new(e, &c, 1, &m));
  batch bt = test_batch(1);
  float logp[B * T];
  CHECK_FAILS(e, MRL_ERR_INVALID, "call mrl_model_forward first",
              mrl_model_score(m, bt.targets, logp, NULL));
  int32_t lengths[B] = {0, 2};
  CHECK_FAILS(e, MRL_ERR_RANGE, "lengths[0] = 0", mrl_model_forward(m, bt.tokens, lengths, B, T));
  CHECK_FAILS(e, MRL_ERR_RANGE, "exceed the model's context",
              mrl_model_forward(m, bt.tokens, bt.lengths, 1, 9));
  batch oob = bt;
  oob.tokens[2] = 11;
  CHECK_FAILS(e, MRL_ERR_RANGE, "token 11 at (0, 2)",
              mrl_model_forward(m, oob.tokens, oob.lengths, B, T));
  CHECK_FAILS(e, MRL_ERR_NULL, "tokens is NULL", mrl_model_forward(m, NULL, bt.lengths, B, T));
  MUST(mrl_model_forward(m, bt.tokens, bt.lengths, B, T));
  oob.targets[0] = 12;
  CHECK_FAILS(e, MRL_ERR_RANGE, "targets[0] = 12", mrl_model_score(m, oob.targets, logp, NULL));
  mrl_adamw opt = {.lr = 0.1f, .beta1 = 1.0f, .beta2 = 0.9f, .eps = 1e-8f};
  CHECK_FAILS(e, MRL_ERR_INVALID, "beta1", mrl_model_adamw_step(m, &opt));
  CHECK_FAILS(e, MRL_ERR_INVALID, "max_norm", mrl_model_clip_grad(m, -1.0, NULL));
  mrl_model_free(m);
  CHECK(mrl_engine_memory_used(e) == 0);
  mrl_engine_free(e);
}

/* ---- allocation failures ---- */

/* The test model's weights on a given engine. */
static mrl_model *test_model_on(mrl_engine *e, const char *kind, uint64_t seed) {
  mrl_model *src = test_model(kind, seed), *m = NULL;
  mrl_model_config c = tiny(kind);
  MUST(mrl_model_new(e, &c, seed, &m));
  memcpy(m->weights, src->weights, sizeof(float) * (size_t)m->numel);
  mrl_model_free(src);
  return m;
}

/* Calls `call` with the allocation request k failing, k = 0, 1, ... until it succeeds; each
 * failure must say MRL_ERR_NOMEM with a message and leave what `same` checks (and the memory
 * held) as it was. Returns the number of failures. */
#define SWEEP(ca, e, failures, call, same)                                                         \
  do {                                                                                             \
    for (long k_ = 0;; k_++) {                                                                     \
      size_t used_ = mrl_engine_memory_used(e);                                                    \
      mrl_engine_clear_error(e);                                                                   \
      counting_alloc_arm(ca, k_);                                                                  \
      mrl_status st_ = (call);                                                                     \
      counting_alloc_arm(ca, -1);                                                                  \
      if (st_ == MRL_OK || k_ == 500) {                                                            \
        CHECKF(st_ == MRL_OK, "%s never succeeded", #call);                                       \
        break;                                                                                     \
      }                                                                                            \
      (failures)++;                                                                                \
      CHECKF(st_ == MRL_ERR_NOMEM && strstr(mrl_engine_last_error(e), "allocate"),                \
             "%s, request %ld failing: status %d, message \"%s\"", #call, k_, st_,                \
             mrl_engine_last_error(e));                                                           \
      CHECKF(mrl_engine_memory_used(e) == used_, "%s, request %ld failing: memory %zu -> %zu",     \
             #call, k_, used_, mrl_engine_memory_used(e));                                        \
      CHECKF(same, "%s, request %ld failing: state changed", #call, k_);                          \
    }                                                                                              \
  } while (0)

/* Forward, score and backward on a fresh engine with 3 threads (so the workers start inside the
 * sweep) fail cleanly at each of their allocations: a failed forward keeps no forward pass, a
 * failed score writes nothing, a failed backward leaves the gradients as they were; what then
 * succeeds gives the bits of a run that never failed. */
static void test_allocation_failures(void) {
  batch bt = test_batch(5);
  float logp_want[B * T], logp[B * T];
  mrl_engine *plain = new_engine();
  MUST(mrl_engine_set_threads(plain, 3));
  mrl_model *want = test_model_on(plain, "qwen3", 9);
  MUST(mrl_model_forward(want, bt.tokens, bt.lengths, B, T));
  MUST(mrl_model_score(want, bt.targets, logp_want, NULL));
  MUST(mrl_model_zero_grad(want));
  MUST(mrl_model_backward(want, bt.targets, bt.coef_logp, bt.coef_ent));

  counting_alloc ca;
  mrl_engine *e = new_counting_engine(&ca);
  MUST(mrl_engine_set_threads(e, 3));
  e->pool_min_work = 0;
  mrl_model *m = test_model_on(e, "qwen3", 9);
  MUST(mrl_model_zero_grad(m));
  float *zeros = calloc((size_t)m->numel, sizeof(float));
  long fwd = 0, score = 0, back = 0;
  SWEEP(&ca, e, fwd, mrl_model_forward(m, bt.tokens, bt.lengths, B, T),
        mrl_model_score(m, bt.targets, logp, NULL) == MRL_ERR_INVALID &&
            memcmp(m->grads, zeros, sizeof(float) * (size_t)m->numel) == 0);
  for (int i = 0; i < B * T; i++) logp[i] = 9.0f;
  SWEEP(&ca, e, score, mrl_model_score(m, bt.targets, logp, NULL), logp[0] == 9.0f);
  CHECK(memcmp(logp, logp_want, sizeof logp) == 0);
  SWEEP(&ca, e, back, mrl_model_backward(m, bt.targets, bt.coef_logp, bt.coef_ent),
        memcmp(m->grads, zeros, sizeof(float) * (size_t)m->numel) == 0);
  CHECK(memcmp(m->grads, want->grads, sizeof(float) * (size_t)m->numel) == 0);
  check_note("allocations failed one by one: %ld in forward, %ld in score, %ld in backward", fwd,
             score, back);
  CHECK(fwd >= 4 && score >= 1 && back >= 2);
  free(zeros);
  mrl_model_free(m);
  mrl_engine_free(e);
  CHECKF(ca.live == 0 && ca.bad_frees == 0, "%ld blocks live, %ld bad frees", ca.live,
         ca.bad_frees);
  mrl_model_free(want);
  mrl_engine_free(plain);
}

static const test_case tests[] = {{"gradients_llama", test_gradients_llama},
                                  {"hidden_states_gradient", test_hidden_states_gradient},
                                  {"gradients_qwen2", test_gradients_qwen2},
                                  {"gradients_qwen3", test_gradients_qwen3},
                                  {"every_parameter_gets_gradient", test_every_parameter_gets_gradient},
                                  {"padding_and_batch_independence", test_padding_and_batch_independence},
                                  {"score_matches_logits", test_score_matches_logits},
                                  {"adamw_and_clipping", test_adamw_and_clipping},
                                  {"lr_schedules", test_lr_schedules},
                                  {"errors", test_errors},
    {"allocation_failures", test_allocation_failures},
                                  {NULL, NULL}};

int main(int argc, char **argv) { return check_main(argc, argv, tests); }
