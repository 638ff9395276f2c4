/* test_decode_bf16.c - decoding from a bfloat16 copy of the weights (mrl_model_set_decode_bf16):
 * the rounding against a double-precision reference; the bf16 kernels give exactly what the
 * float32 kernels give on weights rounded beforehand; a cache on the copy gives the logits of a
 * model whose float32 weights were so rounded; an optimizer step rewrites the copy; the float32
 * path (scoring) is untouched; the log-probability mismatch of sampled tokens against float32
 * scoring (reported); errors and allocation failure. */
#include "model.h"
#include "support.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float bf16_value(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* The rounding: the nearest bfloat16 (ties to the even mantissa), by exhaustive comparison with
 * the two candidates around f in double precision. */
static void test_rounding(void) {
  struct mrl_rng r;
  mrl__rng_seed(&r, 1);
  int bad = 0;
  for (int i = 0; i < 200000; i++) {
    float f;
    if (i < 4) {
      const float special[4] = {0.0f, -0.0f, 1.0f, 1.0f + 1.0f / 256.0f}; /* the last: a tie */
      f = special[i];
    } else {
      uint32_t u = (uint32_t)mrl__rng_u64(&r);
      memcpy(&f, &u, sizeof f);
      if (!isfinite(f) || fabsf(f) > 3e38f) continue;
    }
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1), got = mrl__bf16_round(f);
    double dl = fabs((double)f - bf16_value(lo)), dh = fabs((double)f - bf16_value(hi));
    uint16_t want = dl < dh ? lo : dh < dl ? hi : (lo & 1) ? hi : lo;
    if (got != want) bad++;
  }
  CHECKF(bad == 0, "%d roundings differ from the nearest bfloat16", bad);
  CHECK(mrl__bf16_round(1.0f + 1.0f / 256.0f) == 0x3f80); /* tie to even: down */
  CHECK(isnan(bf16_value(mrl__bf16_round(NAN))));
}

static void kernel_equals_rounded(int level) {
  const char *name = mrl__skinny_use(level);
  mrl_engine *e = new_engine();
  MUST(mrl_engine_set_threads(e, 3));
  e->pool_min_work = 0;
  MUST(mrl__pool_start(e, "test"));
  struct mrl_rng r;
  mrl__rng_seed(&r, 2);
  const int64_t ns[] = {1, 2, 4, 7, 16}, outs[] = {3, 17, 64}, ins[] = {5, 8, 17, 61};
  for (size_t a = 0; a < 5; a++)
    for (size_t b = 0; b < 3; b++)
      for (size_t c = 0; c < 4; c++) {
        int64_t n = ns[a], out = outs[b], in = ins[c];
        float *x = malloc(sizeof(float) * (size_t)(n * in)), *wf = malloc(sizeof(float) * (size_t)(out * in));
        uint16_t *wh = malloc(sizeof(uint16_t) * (size_t)(out * in));
        float *y1 = malloc(sizeof(float) * (size_t)(n * out)), *y2 = malloc(sizeof(float) * (size_t)(n * out));
        for (int64_t i = 0; i < n * in; i++) x[i] = (float)mrl__rng_normal(&r);
        for (int64_t i = 0; i < out * in; i++) {
          wh[i] = mrl__bf16_round((float)mrl__rng_normal(&r));
          wf[i] = bf16_value(wh[i]);
        }
        for (int64_t i = 0; i < n * out; i++) y1[i] = y2[i] = (float)i;
        mrl__skinny_gemm_bf16(e, y1, out, x, in, wh, in, n, out, in, (float)(b % 2));
        mrl__skinny_gemm(e, y2, out, x, in, wf, in, n, out, in, (float)(b % 2));
        CHECKF(memcmp(y1, y2, sizeof(float) * (size_t)(n * out)) == 0,
               "%s: n %lld out %lld in %lld: bf16 kernel differs", name, (long long)n,
               (long long)out, (long long)in);
        free(x);
        free(wf);
        free(wh);
        free(y1);
        free(y2);
      }
  mrl_engine_free(e);
}

/* The bf16 kernel equals the float32 kernel on the rounded weights, bit for bit, at every kernel
 * level this CPU runs (AVX-512, AVX2, portable). */
static void test_kernel_equals_rounded(void) {
  for (int level = 0; mrl__skinny_use(level); level++) kernel_equals_rounded(level);
  mrl__skinny_use(-1);
}

enum { VOCAB = 97, CTX = 40 };

static mrl_model *make_model(mrl_engine *e) {
  mrl_model_config c;
  mrl_model_config_default(&c);
  c.vocab = VOCAB;
  c.dim = 48;
  c.layers = 2;
  c.heads = 6;
  c.kv_heads = 2;
  c.head_dim = 10; /* not dim / heads */
  c.ffn = 72;
  c.ctx = CTX;
  c.qk_norm = 1;
  c.tie_embeddings = 0;
  mrl_model *m = NULL;
  MUST(mrl_model_new(e, &c, 9, &m));
  struct mrl_rng r;
  mrl__rng_seed(&r, 10);
  for (int64_t i = 0; i < m->numel; i++) m->weights[i] += (float)(0.1 * mrl__rng_normal(&r));
  return m;
}

/* Logits after appending t (a prompt of 20 rows through one append, then 6 single tokens) to a
 * new cache of model m: out (7, VOCAB). */
static void decode_logits(mrl_model *m, const int32_t *t, float *out) {
  mrl_kv_cache *c = NULL;
  MUST(mrl_kv_cache_new(m, 2, CTX, &c));
  int slot = 1, count = 20;
  MUST(mrl_kv_cache_append(c, 1, &slot, t, &count));
  memcpy(out, mrl_kv_cache_logits(c, 1), sizeof(float) * VOCAB);
  for (int i = 0; i < 6; i++) {
    count = 1;
    MUST(mrl_kv_cache_append(c, 1, &slot, t + 20 + i, &count));
    memcpy(out + (i + 1) * VOCAB, mrl_kv_cache_logits(c, 1), sizeof(float) * VOCAB);
  }
  mrl_kv_cache_free(c);
}

static void test_cache_reads_the_copy(void) {
  mrl_engine *e = new_engine();
  mrl_model *m = make_model(e), *rounded = NULL;
  int32_t t[26];
  for (int i = 0; i < 26; i++) t[i] = (int32_t)((i * 37 + 11) % VOCAB);
  float f32[7 * VOCAB], bf[7 * VOCAB], want[7 * VOCAB];
  decode_logits(m, t, f32);
  CHECK(mrl_model_decode_bf16(m) == 0);
  MUST(mrl_model_set_decode_bf16(m, 1));
  CHECK(mrl_model_decode_bf16(m) == 1);
  decode_logits(m, t, bf);
  /* the same model with its float32 weights rounded, decoded in float32 through the same
   * kernels (so that prefill rows, too, take the kernels and not OpenBLAS) */
  MUST(mrl_model_clone(m, &rounded));
  /* (what the copy replaces: the projection matrices and the untied head; norms, biases and the
   * embedding lookup stay float32) */
  for (int p = 0; p < rounded->nparams; p++) {
    const mrl_param *q = &rounded->params[p];
    if (q->rank != 2 || strstr(q->name, "embed_tokens")) continue;
    for (int64_t i = q->offset; i < q->offset + q->numel; i++)
      rounded->weights[i] = bf16_value(mrl__bf16_round(rounded->weights[i]));
  }
  MUST(mrl_model_set_decode_bf16(rounded, 1)); /* its copy: exactly its weights */
  decode_logits(rounded, t, want);
  CHECK(memcmp(bf, want, sizeof bf) == 0);
  double d = 0.0;
  for (int i = 0; i < 7 * VOCAB; i++) d = fmax(d, fabs((double)bf[i] - f32[i]));
  check_note("logits, bf16 copy vs float32 weights: max |difference| %.2e", d);
  CHECK(d > 0.0 && d < 0.1);
  MUST(mrl_model_set_decode_bf16(m, 0));
  decode_logits(m, t, bf);
  CHECK(memcmp(bf, f32, sizeof bf) == 0);
  mrl_model_free(m);
  mrl_model_free(rounded);
  mrl_engine_free(e);
}

/* An AdamW step rewrites the copy; scoring stays float32. */
static void test_step_refreshes_and_scoring_untouched(void) {
  mrl_engine *e = new_engine();
  mrl_model *m = make_model(e);
  int32_t t[26], targets[26], len = 26;
  for (int i = 0; i < 26; i++) t[i] = (int32_t)((i * 53 + 7) % VOCAB);
  for (int i = 0; i < 26; i++) targets[i] = i + 1 < 26 ? t[i + 1] : -1;
  float before[26], after[26], g[26];
  for (int i = 0; i < 26; i++) g[i] = 1.0f;
  MUST(mrl_model_forward(m, t, &len, 1, 26));
  MUST(mrl_model_score(m, targets, before, NULL));
  MUST(mrl_model_set_decode_bf16(m, 1));
  MUST(mrl_model_forward(m, t, &len, 1, 26));
  MUST(mrl_model_score(m, targets, after, NULL));
  CHECK(memcmp(before, after, sizeof before) == 0);
  MUST(mrl_model_zero_grad(m));
  MUST(mrl_model_backward(m, targets, g, NULL));
  mrl_adamw opt = {.lr = 0.05f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f};
  MUST(mrl_model_adamw_step(m, &opt));
  int stale = 0;
  for (int64_t i = 0; i < m->numel; i++) stale += m->decode_bf16[i] != mrl__bf16_round(m->weights[i]);
  CHECKF(stale == 0, "%d weights of the copy were not rewritten by the step", stale);
  mrl_model_free(m);
  mrl_engine_free(e);
}

/* Sampled tokens' behaviour log-probabilities from the bf16 copy against float32 scoring of the
 * same tokens: the mismatch this mode brings (reported; bounded loosely). */
static void test_logprob_mismatch(void) {
  mrl_engine *e = new_engine();
  mrl_model *m = make_model(e);
  MUST(mrl_model_set_decode_bf16(m, 1));
  enum { B = 8, NEW = 24, P = 4 };
  mrl_kv_cache *c = NULL;
  MUST(mrl_kv_cache_new(m, B, CTX, &c));
  int32_t seq[B][P + NEW];
  float behaviour[B][NEW];
  int slots[B], counts[B];
  int32_t prompt[B * P];
  for (int b = 0; b < B; b++) {
    slots[b] = b;
    counts[b] = P;
    for (int i = 0; i < P; i++) seq[b][i] = prompt[b * P + i] = (int32_t)((b * 7 + i * 3) % VOCAB);
    MUST(mrl_kv_cache_reset(c, b, 100 + (uint64_t)b));
  }
  MUST(mrl_kv_cache_append(c, B, slots, prompt, counts));
  mrl_sampling s = {.temperature = 1.0f};
  for (int k = 0; k < NEW; k++) {
    int32_t tok[B];
    float lp[B];
    MUST(mrl_kv_cache_sample(c, B, slots, &s, tok, lp));
    for (int b = 0; b < B; b++) {
      seq[b][P + k] = tok[b];
      behaviour[b][k] = lp[b];
      counts[b] = 1;
    }
    MUST(mrl_kv_cache_append(c, B, slots, tok, counts));
  }
  int32_t tokens[B * (P + NEW)], lengths[B], targets[B * (P + NEW)];
  for (int b = 0; b < B; b++) {
    lengths[b] = P + NEW;
    for (int i = 0; i < P + NEW; i++) {
      tokens[b * (P + NEW) + i] = seq[b][i];
      targets[b * (P + NEW) + i] = i + 1 >= P && i + 1 < P + NEW ? seq[b][i + 1] : -1;
    }
  }
  float scored[B * (P + NEW)];
  MUST(mrl_model_forward(m, tokens, lengths, B, P + NEW));
  MUST(mrl_model_score(m, targets, scored, NULL));
  double worst = 0.0, sum = 0.0;
  int count = 0;
  for (int b = 0; b < B; b++)
    for (int k = 0; k + 1 < NEW; k++) {
      double d = fabs((double)behaviour[b][k + 1] - scored[b * (P + NEW) + P + k]);
      worst = fmax(worst, d);
      sum += d;
      count++;
    }
  check_note("behaviour log-probs (bf16 decode) vs float32 scoring: mean |difference| %.2e, max %.2e over %d tokens",
             sum / count, worst, count);
  CHECK(worst > 0.0 && worst < 0.5);
  mrl_kv_cache_free(c);
  mrl_model_free(m);
  mrl_engine_free(e);
}

static void test_errors_and_allocation(void) {
  CHECK(mrl_model_set_decode_bf16(NULL, 1) == MRL_ERR_NULL);
  CHECK(mrl_model_decode_bf16(NULL) == 0);
  counting_alloc ca;
  mrl_engine *e = new_counting_engine(&ca);
  mrl_model *m = make_model(e);
  counting_alloc_arm(&ca, 0);
  CHECK_FAILS(e, MRL_ERR_NOMEM, "bfloat16", mrl_model_set_decode_bf16(m, 1));
  CHECK(mrl_model_decode_bf16(m) == 0);
  counting_alloc_arm(&ca, -1);
  MUST(mrl_model_set_decode_bf16(m, 1));
  MUST(mrl_model_set_decode_bf16(m, 1)); /* again: a refresh, no new allocation */
  MUST(mrl_model_set_decode_bf16(m, 0));
  CHECK(mrl_model_decode_bf16(m) == 0);
  mrl_model_free(m);
  mrl_engine_free(e);
  CHECK(ca.live == 0 && ca.bad_frees == 0);
}

static const test_case tests[] = {{"rounding", test_rounding},
                                  {"kernel_equals_rounded", test_kernel_equals_rounded},
                                  {"cache_reads_the_copy", test_cache_reads_the_copy},
                                  {"step_refreshes_and_scoring_untouched", test_step_refreshes_and_scoring_untouched},
                                  {"logprob_mismatch", test_logprob_mismatch},
                                  {"errors_and_allocation", test_errors_and_allocation},
                                  {NULL, NULL}};

int main(int argc, char **argv) { return check_main(argc, argv, tests); }
