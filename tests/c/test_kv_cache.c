/* test_kv_cache.c - incremental decoding against the full forward pass (one run, token by token,
 * ragged batches), and sampling: greedy, seeds per sequence independent of the batch, behaviour
 * log-probabilities, and the support of top-k / top-p / min-p; truncation to a saved length;
 * batch-invariant appends; argument errors; allocation
 * failures in appends and sampling that change nothing; non-finite logits refused. */
#include "model.h"
#include "support.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { VOCAB = 13, CTX = 16 };

static mrl_model *make_model(const char *kind, mrl_engine *e, uint64_t seed) {
  mrl_model_config c;
  mrl_model_config_default(&c);
  c.vocab = VOCAB;
  c.dim = 16;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = strcmp(kind, "llama") ? 2 : 4;
  c.ffn = 24;
  c.ctx = CTX;
  c.qkv_bias = !strcmp(kind, "qwen2");
  c.qk_norm = !strcmp(kind, "qwen3");
  c.tie_embeddings = !strcmp(kind, "llama");
  mrl_model *m = NULL;
  MUST(mrl_model_new(e, &c, seed, &m));
  struct mrl_rng r;
  mrl__rng_seed(&r, seed + 100);
  for (int64_t i = 0; i < m->numel; i++) m->weights[i] += (float)(0.2 * mrl__rng_normal(&r));
  return m;
}

static void tokens_of(int32_t *t, int n, uint64_t seed) {
  struct mrl_rng r;
  mrl__rng_seed(&r, seed);
  for (int i = 0; i < n; i++) t[i] = (int32_t)(mrl__rng_u64(&r) % VOCAB);
}

/* Logits of the full forward pass at every position of one sequence: out (n, VOCAB). */
static void forward_logits(mrl_model *m, const int32_t *t, int n, float *out) {
  int32_t len = n;
  MUST(mrl_model_forward(m, t, &len, 1, n));
  mrl_tensor *z = NULL;
  MUST(mrl_model_logits(m, &z));
  memcpy(out, mrl_tensor_data(z), sizeof(float) * (size_t)(n * VOCAB));
  mrl_tensor_free(z);
}

static double max_diff(const float *a, const float *b, int n) {
  double w = 0.0;
  for (int i = 0; i < n; i++) w = fmax(w, fabs((double)a[i] - b[i]));
  return w;
}

static void check_matches_forward(const char *kind) {
  mrl_engine *e = new_engine();
  mrl_model *m = make_model(kind, e, 3);
  int32_t t[12];
  tokens_of(t, 12, 5);
  float full[12 * VOCAB];
  forward_logits(m, t, 12, full);
  mrl_kv_cache *c = NULL;
  MUST(mrl_kv_cache_new(m, 3, CTX, &c));
  /* slot 0: all at once; slot 1: one token at a time; slot 2: 5 then 4 then 3 */
  int slot = 0, count = 12;
  MUST(mrl_kv_cache_append(c, 1, &slot, t, &count));
  double worst = max_diff(mrl_kv_cache_logits(c, 0), full + 11 * VOCAB, VOCAB);
  double worst_step = 0.0;
  for (int i = 0; i < 12; i++) {
    int s = 1, one = 1;
    MUST(mrl_kv_cache_append(c, 1, &s, t + i, &one));
    worst_step = fmax(worst_step, max_diff(mrl_kv_cache_logits(c, 1), full + i * VOCAB, VOCAB));
  }
  int parts[3] = {5, 4, 3}, off = 0;
  for (int k = 0; k < 3; k++) {
    int s = 2;
    MUST(mrl_kv_cache_append(c, 1, &s, t + off, &parts[k]));
    off += parts[k];
    worst = fmax(worst, max_diff(mrl_kv_cache_logits(c, 2), full + (off - 1) * VOCAB, VOCAB));
  }
  check_note("%s: cache vs forward, whole runs %.2e, token by token %.2e", kind, worst,
             worst_step);
  CHECK(worst < 1e-5 && worst_step < 1e-5);
  CHECK(mrl_kv_cache_length(c, 0) == 12 && mrl_kv_cache_length(c, 1) == 12);
  mrl_kv_cache_free(c);
  mrl_model_free(m);
  CHECK(mrl_engine_memory_used(e) == 0);
  mrl_engine_free(e);
}

static void test_matches_forward_llama(void) { check_matches_forward("llama"); }
static void test_matches_forward_qwen2(void) { check_matches_forward("qwen2"); }
static void test_matches_forward_qwen3(void) { check_matches_forward("qwen3"); }

/* A ragged batch appended at once equals each run appended alone. */
static void test_ragged_batch(void) {
  mrl_engine *e = new_engine();
  mrl_model *m = make_model("qwen2", e, 9);
  int32_t t[3 + 7 + 1];
  tokens_of(t, 11, 6);
  mrl_kv_cache *c = NULL, *alone = NULL;
  MUST(mrl_kv_cache_new(m, 4, CTX, &c));
  MUST(mrl_kv_cache_new(m, 1, CTX, &alone));
  int slots[3] = {3, 0, 2}, counts[3] = {3, 7, 1};
  MUST(mrl_kv_cache_append(c, 3, slots, t, counts));
  double worst = 0.0;
  for (int i = 0, off = 0; i < 3; off += counts[i], i++) {
    int s = 0;
    MUST(mrl_kv_cache_reset(alone, 0, 1));
    MUST(mrl_kv_cache_append(alone, 1, &s, t + off, &counts[i]));
    worst = fmax(worst, max_diff(mrl_kv_cache_logits(c, slots[i]), mrl_kv_cache_logits(alone, 0),
                                 VOCAB));
  }
  check_note("ragged batch vs alone: max |difference| %.2e", worst);
  CHECK(worst < 1e-5);
  CHECK(mrl_kv_cache_logits(c, 1) == NULL); /* never appended */
  mrl_kv_cache_free(alone);
  mrl_kv_cache_free(c);
  mrl_model_free(m);
  mrl_engine_free(e);
}

/* Generates `steps` tokens for the listed slots (prompt already appended). */
static void generate(mrl_kv_cache *c, int n, const int *slots, const mrl_sampling *s, int steps,
                     int32_t *out, float *logp) {
  for (int k = 0; k < steps; k++) {
    int32_t tok[8];
    float lp[8];
    MUST(mrl_kv_cache_sample(c, n, slots, s, tok, lp));
    int ones[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    MUST(mrl_kv_cache_append(c, n, slots, tok, ones));
    for (int i = 0; i < n; i++) {
      out[i * steps + k] = tok[i];
      if (logp) logp[i * steps + k] = lp[i];
    }
  }
}

static void test_seeded_sampling_independent_of_batch(void) {
  mrl_engine *e = new_engine();
  mrl_model *m = make_model("llama", e, 4);
  mrl_kv_cache *c = NULL;
  MUST(mrl_kv_cache_new(m, 3, CTX, &c));
  int32_t prompt[4];
  tokens_of(prompt, 4, 8);
  mrl_sampling s = {.temperature = 1.0f, .top_p = 1.0f};
  int32_t alone[8], together[3 * 8], again[8];
  float lp_alone[8];
  /* slot 1 alone with seed 42 */
  int one = 1, four = 4;
  MUST(mrl_kv_cache_reset(c, 1, 42));
  MUST(mrl_kv_cache_append(c, 1, &one, prompt, &four));
  generate(c, 1, &one, &s, 8, alone, lp_alone);
  /* the same slot and seed with two other sequences in the batch */
  int slots[3] = {0, 1, 2}, counts[3] = {4, 4, 4};
  int32_t prompts[12];
  tokens_of(prompts, 12, 9);
  memcpy(prompts + 4, prompt, sizeof prompt);
  for (int i = 0; i < 3; i++) MUST(mrl_kv_cache_reset(c, i, i == 1 ? 42 : 7 + (uint64_t)i));
  MUST(mrl_kv_cache_append(c, 3, slots, prompts, counts));
  generate(c, 3, slots, &s, 8, together, NULL);
  CHECK(memcmp(alone, together + 8, sizeof alone) == 0);
  /* a different seed gives a different continuation (with 13 tokens, 8 draws) */
  MUST(mrl_kv_cache_reset(c, 1, 43));
  MUST(mrl_kv_cache_append(c, 1, &one, prompt, &four));
  generate(c, 1, &one, &s, 8, again, NULL);
  CHECK(memcmp(alone, again, sizeof alone) != 0);
  /* behaviour log-probabilities are the forward pass's log-softmax of the sampled tokens */
  int32_t seq[12];
  memcpy(seq, prompt, sizeof prompt);
  memcpy(seq + 4, alone, sizeof alone);
  int32_t len = 12, targets[12];
  float logp[12];
  for (int i = 0; i < 12; i++) targets[i] = i >= 3 && i < 11 ? seq[i + 1] : -1;
  MUST(mrl_model_forward(m, seq, &len, 1, 12));
  MUST(mrl_model_score(m, targets, logp, NULL));
  double worst = 0.0;
  for (int k = 0; k < 8; k++) worst = fmax(worst, fabs(logp[3 + k] - lp_alone[k]));
  check_note("sampled log-probabilities vs a fresh forward: max |difference| %.2e", worst);
  CHECK(worst < 1e-4);
  mrl_kv_cache_free(c);
  mrl_model_free(m);
  mrl_engine_free(e);
}

/* Draws many tokens from one state (resetting nothing: sampling does not append) and counts. */
static void histogram(mrl_kv_cache *c, int slot, const mrl_sampling *s, int draws, int *counts) {
  memset(counts, 0, sizeof(int) * VOCAB);
  for (int i = 0; i < draws; i++) {
    int32_t tok;
    MUST(mrl_kv_cache_sample(c, 1, &slot, s, &tok, NULL));
    counts[tok]++;
  }
}

static void test_sampling_distributions(void) {
  mrl_engine *e = new_engine();
  mrl_model *m = make_model("qwen3", e, 12);
  mrl_kv_cache *c = NULL;
  MUST(mrl_kv_cache_new(m, 1, CTX, &c));
  int32_t prompt[3];
  tokens_of(prompt, 3, 2);
  int slot = 0, three = 3;
  MUST(mrl_kv_cache_append(c, 1, &slot, prompt, &three));
  const float *z = mrl_kv_cache_logits(c, 0);
  /* reference probabilities at temperature 0.7, sorted order */
  double p[VOCAB], mx = z[0], sum = 0.0;
  int order[VOCAB];
  for (int j = 1; j < VOCAB; j++) mx = fmax(mx, z[j]);
  for (int j = 0; j < VOCAB; j++) sum += p[j] = exp((z[j] - mx) / 0.7);
  for (int j = 0; j < VOCAB; j++) {
    p[j] /= sum;
    order[j] = j;
  }
  for (int i = 0; i < VOCAB; i++) /* selection sort, descending */
    for (int j = i + 1; j < VOCAB; j++)
      if (p[order[j]] > p[order[i]]) {
        int t = order[i];
        order[i] = order[j];
        order[j] = t;
      }
  int counts[VOCAB];
  enum { DRAWS = 20000 };
  mrl_sampling plain = {.temperature = 0.7f};
  histogram(c, 0, &plain, DRAWS, counts);
  double worst = 0.0;
  for (int j = 0; j < VOCAB; j++) worst = fmax(worst, fabs(counts[j] / (double)DRAWS - p[j]));
  check_note("temperature 0.7: max |frequency - probability| %.4f over %d draws", worst, DRAWS);
  CHECK(worst < 0.02);

  mrl_sampling greedy = {.temperature = 0.0f};
  histogram(c, 0, &greedy, 50, counts);
  CHECK(counts[order[0]] == 50);
  mrl_sampling k1 = {.temperature = 1.0f, .top_k = 1};
  histogram(c, 0, &k1, 50, counts);
  CHECK(counts[order[0]] == 50);

  mrl_sampling k3 = {.temperature = 0.7f, .top_k = 3};
  histogram(c, 0, &k3, 2000, counts);
  int outside = 0;
  for (int r = 3; r < VOCAB; r++) outside += counts[order[r]];
  CHECK(outside == 0 && counts[order[0]] > 0 && counts[order[2]] > 0);

  /* top-p: the smallest prefix of the sorted tokens reaching the mass */
  double mass = 0.0;
  int keep = 0;
  while (mass < 0.8) mass += p[order[keep++]];
  mrl_sampling nucleus = {.temperature = 0.7f, .top_p = 0.8f};
  histogram(c, 0, &nucleus, 4000, counts);
  outside = 0;
  for (int r = keep; r < VOCAB; r++) outside += counts[order[r]];
  CHECKF(outside == 0 && counts[order[keep - 1]] > 0, "top-p kept %d tokens", keep);

  mrl_sampling minp = {.temperature = 0.7f, .min_p = 0.3f};
  histogram(c, 0, &minp, 4000, counts);
  for (int j = 0; j < VOCAB; j++)
    if (p[j] < 0.3 * p[order[0]]) CHECKF(counts[j] == 0, "min-p let token %d through", j);
  mrl_kv_cache_free(c);
  mrl_model_free(m);
  mrl_engine_free(e);
}

/* Masked draws (forced tool calls): only allowed tokens come out, at the frequencies of the
 * temperature-scaled distribution renormalised over them, with that distribution's logprob; the
 * greedy draw is the best allowed token; nothing allowed is an error that draws nothing. */
static void test_sample_masked(void) {
  mrl_engine *e = new_engine();
  mrl_model *m = make_model("qwen3", e, 12);
  mrl_kv_cache *c = NULL;
  MUST(mrl_kv_cache_new(m, 1, CTX, &c));
  int32_t prompt[3];
  tokens_of(prompt, 3, 2);
  int slot = 0, three = 3;
  MUST(mrl_kv_cache_append(c, 1, &slot, prompt, &three));
  const float *z = mrl_kv_cache_logits(c, 0);
  uint8_t allowed[VOCAB];
  double p[VOCAB], mx = -INFINITY, sum = 0.0;
  int best = -1;
  for (int j = 0; j < VOCAB; j++) {
    allowed[j] = j % 3 == 1;
    if (allowed[j] && z[j] > mx) mx = z[j], best = j;
  }
  for (int j = 0; j < VOCAB; j++) sum += p[j] = allowed[j] ? exp((z[j] - mx) / 0.7) : 0.0;
  for (int j = 0; j < VOCAB; j++) p[j] /= sum;
  mrl_sampling s = {.temperature = 0.7f};
  enum { DRAWS = 20000 };
  int counts[VOCAB] = {0};
  double worst_lp = 0.0;
  for (int d = 0; d < DRAWS; d++) {
    int32_t tok;
    float lp;
    MUST(mrl_kv_cache_sample_masked(c, 0, &s, allowed, &tok, &lp));
    counts[tok]++;
    worst_lp = fmax(worst_lp, fabs(lp - log(p[tok])));
  }
  double worst = 0.0;
  for (int j = 0; j < VOCAB; j++) {
    if (!allowed[j]) CHECKF(counts[j] == 0, "token %d is not allowed but was drawn", j);
    worst = fmax(worst, fabs(counts[j] / (double)DRAWS - p[j]));
  }
  check_note("masked, temperature 0.7: max |frequency - probability| %.4f, |logprob error| %.2g",
             worst, worst_lp);
  CHECK(worst < 0.02 && worst_lp < 1e-5);
  mrl_sampling greedy = {.temperature = 0.0f};
  int32_t tok = -1;
  MUST(mrl_kv_cache_sample_masked(c, 0, &greedy, allowed, &tok, NULL));
  CHECK(tok == best);
  memset(allowed, 0, sizeof allowed);
  tok = -5;
  CHECK_FAILS(e, MRL_ERR_INVALID, "no token is allowed",
              mrl_kv_cache_sample_masked(c, 0, &s, allowed, &tok, NULL));
  CHECK(tok == -5);
  CHECK_FAILS(e, MRL_ERR_NULL, "allowed", mrl_kv_cache_sample_masked(c, 0, &s, NULL, &tok, NULL));
  CHECK_FAILS(e, MRL_ERR_RANGE, "slot", mrl_kv_cache_sample_masked(c, 3, &s, allowed, &tok, NULL));
  mrl_kv_cache_free(c);
  mrl_model_free(m);
  mrl_engine_free(e);
}

static void test_errors(void) {
  mrl_engine *e = new_engine();
  mrl_model *m = make_model("llama", e, 1);
  mrl_kv_cache *c = NULL;
  CHECK_FAILS(e, MRL_ERR_INVALID, "capacity <= ctx", mrl_kv_cache_new(m, 2, CTX + 1, &c));
  CHECK_FAILS(e, MRL_ERR_INVALID, "slots > 0", mrl_kv_cache_new(m, 0, 4, &c));
  MUST(mrl_kv_cache_new(m, 2, 4, &c));
  int32_t t[5] = {1, 2, 3, 4, 5};
  int slot = 0, five = 5, two = 2, bad_slot = 2;
  int slots2[2] = {0, 0}, counts2[2] = {1, 1};
  CHECK_FAILS(e, MRL_ERR_RANGE, "would hold 5 tokens, capacity 4",
              mrl_kv_cache_append(c, 1, &slot, t, &five));
  CHECK_FAILS(e, MRL_ERR_RANGE, "slot 2 is outside 0..1",
              mrl_kv_cache_append(c, 1, &bad_slot, t, &two));
  CHECK_FAILS(e, MRL_ERR_INVALID, "slot 0 is listed twice",
              mrl_kv_cache_append(c, 2, slots2, t, counts2));
  int32_t bad_tok = VOCAB;
  int one = 1;
  CHECK_FAILS(e, MRL_ERR_RANGE, "token 13 is outside", mrl_kv_cache_append(c, 1, &slot, &bad_tok, &one));
  CHECK(mrl_kv_cache_length(c, 0) == 0);
  mrl_sampling s = {.temperature = 1.0f};
  int32_t out;
  CHECK_FAILS(e, MRL_ERR_INVALID, "no tokens to continue from",
              mrl_kv_cache_sample(c, 1, &slot, &s, &out, NULL));
  MUST(mrl_kv_cache_append(c, 1, &slot, t, &two));
  mrl_sampling bad = {.temperature = -1.0f};
  CHECK_FAILS(e, MRL_ERR_INVALID, "temperature >= 0", mrl_kv_cache_sample(c, 1, &slot, &bad, &out, NULL));
  CHECK(mrl_kv_cache_length(c, 5) == -1 && mrl_kv_cache_logits(c, 5) == NULL);
  CHECK_FAILS(e, MRL_ERR_INVALID, "src and dst are the same", mrl_kv_cache_copy(c, 0, 0, 1));
  CHECK_FAILS(e, MRL_ERR_RANGE, "slot 2 is outside 0..1", mrl_kv_cache_copy(c, 0, 2, 1));
  CHECK(mrl_kv_cache_copy(NULL, 0, 1, 1) == MRL_ERR_NULL && mrl_model_engine(NULL) == NULL);
  CHECK(mrl_model_engine(m) == e);
  mrl_kv_cache_free(c);
  mrl_model_free(m);
  CHECK(mrl_engine_memory_used(e) == 0);
  mrl_engine_free(e);
}

/* A copied slot continues exactly as its source: same logits, same length, and with the same
 * seed the same samples. */
static void test_copy_slot(void) {
  mrl_engine *e = new_engine();
  mrl_model *m = make_model("qwen3", e, 4);
  mrl_kv_cache *c = NULL;
  MUST(mrl_kv_cache_new(m, 2, CTX, &c));
  int32_t t[6];
  tokens_of(t, 6, 9);
  int slot0 = 0, slot1 = 1, six = 6, one = 1;
  MUST(mrl_kv_cache_reset(c, 0, 5));
  MUST(mrl_kv_cache_append(c, 1, &slot0, t, &six));
  MUST(mrl_kv_cache_copy(c, 0, 1, 5));
  CHECK(mrl_kv_cache_length(c, 1) == 6);
  CHECK(max_diff(mrl_kv_cache_logits(c, 0), mrl_kv_cache_logits(c, 1), VOCAB) == 0.0);
  mrl_sampling s = {.temperature = 1.0f};
  for (int step = 0; step < 4; step++) {
    int32_t a, b;
    MUST(mrl_kv_cache_sample(c, 1, &slot0, &s, &a, NULL));
    MUST(mrl_kv_cache_sample(c, 1, &slot1, &s, &b, NULL));
    CHECK(a == b);
    MUST(mrl_kv_cache_append(c, 1, &slot0, &a, &one));
    MUST(mrl_kv_cache_append(c, 1, &slot1, &b, &one));
    CHECK(max_diff(mrl_kv_cache_logits(c, 0), mrl_kv_cache_logits(c, 1), VOCAB) < 1e-6);
  }
  mrl_kv_cache_free(c);
  mrl_model_free(m);
  mrl_engine_free(e);
}

/* Truncating a slot back to a saved length with the logits saved there: the next append of the
 * same tokens gives the same logits as the first time, the next draw comes from the restored
 * distribution; bad lengths and a NULL are refused, changing nothing. */
static void test_truncate(void) {
  mrl_engine *e = new_engine();
  mrl_model *m = make_model("qwen2", e, 8);
  mrl_kv_cache *c = NULL;
  MUST(mrl_kv_cache_new(m, 2, CTX, &c));
  int32_t t[6];
  tokens_of(t, 6, 3);
  int slot = 0, three = 3;
  float at3[VOCAB], at6[VOCAB];
  MUST(mrl_kv_cache_append(c, 1, &slot, t, &three));
  memcpy(at3, mrl_kv_cache_logits(c, 0), sizeof at3);
  MUST(mrl_kv_cache_append(c, 1, &slot, t + 3, &three));
  memcpy(at6, mrl_kv_cache_logits(c, 0), sizeof at6);
  MUST(mrl_kv_cache_truncate(c, 0, 3, at3));
  CHECK(mrl_kv_cache_length(c, 0) == 3 && max_diff(mrl_kv_cache_logits(c, 0), at3, VOCAB) == 0.0);
  mrl_sampling greedy = {.temperature = 0.0f};
  int32_t next;
  MUST(mrl_kv_cache_sample(c, 1, &slot, &greedy, &next, NULL));
  int best = 0;
  for (int v = 1; v < VOCAB; v++) if (at3[v] > at3[best]) best = v;
  CHECK(next == best);
  MUST(mrl_kv_cache_append(c, 1, &slot, t + 3, &three));
  CHECK(max_diff(mrl_kv_cache_logits(c, 0), at6, VOCAB) == 0.0);
  CHECK_FAILS(e, MRL_ERR_RANGE, "length 7 is outside 1..6", mrl_kv_cache_truncate(c, 0, 7, at3));
  CHECK_FAILS(e, MRL_ERR_RANGE, "length 0", mrl_kv_cache_truncate(c, 0, 0, at3));
  CHECK_FAILS(e, MRL_ERR_NULL, "logits is NULL", mrl_kv_cache_truncate(c, 0, 3, NULL));
  CHECK_FAILS(e, MRL_ERR_RANGE, "slot 2", mrl_kv_cache_truncate(c, 2, 3, at3));
  CHECK(mrl_kv_cache_length(c, 0) == 6 && max_diff(mrl_kv_cache_logits(c, 0), at6, VOCAB) == 0.0);
  CHECK(mrl_kv_cache_truncate(NULL, 0, 1, at3) == MRL_ERR_NULL);
  mrl_kv_cache_free(c);
  mrl_model_free(m);
  CHECK(mrl_engine_memory_used(e) == 0);
  mrl_engine_free(e);
}

/* With batch invariance a slot's logits are the same floats appended alone as among 96 others,
 * with a model large enough for OpenBLAS to pick other kernels for the batch (the difference
 * without it is noted, not required: another BLAS may have none). */
static void test_batch_invariant_appends(void) {
  enum { SLOTS = 97, V = 264 };
  mrl_engine *e = new_engine();
  mrl_model_config cfg;
  mrl_model_config_default(&cfg);
  cfg.vocab = V;
  cfg.dim = 64;
  cfg.layers = 1;
  cfg.heads = 4;
  cfg.kv_heads = 4;
  cfg.ffn = 192;
  cfg.ctx = 8;
  mrl_model *m = NULL;
  MUST(mrl_model_new(e, &cfg, 2, &m));
  mrl_kv_cache *c = NULL;
  MUST(mrl_kv_cache_new(m, SLOTS, 8, &c));
  int slots[SLOTS], ones[SLOTS];
  int32_t tokens[SLOTS];
  for (int i = 0; i < SLOTS; i++) {
    slots[i] = i;
    ones[i] = 1;
    tokens[i] = (int32_t)((i * 37) % V);
  }
  double gap[2];
  for (int on = 0; on <= 1; on++) {
    MUST(mrl_kv_cache_set_batch_invariant(c, on));
    float alone[V];
    MUST(mrl_kv_cache_reset(c, 0, 1));
    MUST(mrl_kv_cache_append(c, 1, slots, tokens, ones));
    memcpy(alone, mrl_kv_cache_logits(c, 0), sizeof alone);
    for (int i = 0; i < SLOTS; i++) MUST(mrl_kv_cache_reset(c, i, 1));
    MUST(mrl_kv_cache_append(c, SLOTS, slots, tokens, ones));
    gap[on] = max_diff(alone, mrl_kv_cache_logits(c, 0), V);
  }
  check_note("slot 0's logits alone and among %d: max |difference| %.2e without, %.2e with "
             "batch invariance", SLOTS, gap[0], gap[1]);
  CHECK(gap[1] == 0.0);
  CHECK(mrl_kv_cache_set_batch_invariant(NULL, 1) == MRL_ERR_NULL);
  mrl_kv_cache_free(c);
  mrl_model_free(m);
  mrl_engine_free(e);
}

/* ---- failures change nothing ---- */

/* Slot state that a failing call must leave as it was. */
typedef struct {
  int length[3];
  bool has_logits[3];
  float logits[3][VOCAB];
} slot_state;

static slot_state state_of(const mrl_kv_cache *c) {
  slot_state st;
  memset(&st, 0, sizeof st);
  for (int i = 0; i < 3; i++) {
    st.length[i] = mrl_kv_cache_length(c, i);
    const float *z = mrl_kv_cache_logits(c, i);
    st.has_logits[i] = z != NULL;
    if (z) memcpy(st.logits[i], z, sizeof st.logits[i]);
  }
  return st;
}

/* The cache of both sweeps: slot 0 holds 3 tokens, appended on one thread (so the workers and
 * the larger buffers the swept calls need are not there yet); then 3 threads. */
static mrl_kv_cache *sweep_cache(mrl_engine *e, mrl_model **m, const int32_t *t) {
  MUST(mrl_engine_set_threads(e, 1));
  *m = make_model("qwen3", e, 21);
  mrl_kv_cache *c = NULL;
  MUST(mrl_kv_cache_new(*m, 3, CTX, &c));
  int slot = 0, three = 3;
  MUST(mrl_kv_cache_append(c, 1, &slot, t, &three));
  MUST(mrl_engine_set_threads(e, 3));
  e->pool_min_work = 0;
  return c;
}

/* An append that fails at any of its allocations leaves lengths, logits and their validity as
 * they were (it used to count the tokens in before allocating the logits), holds no more memory,
 * and the append that then succeeds gives the bits of one that never failed. */
static void test_append_allocation_failures(void) {
  int32_t t[3 + 6 + 5];
  tokens_of(t, 14, 31);
  int slots[2] = {0, 1}, counts[2] = {6, 5};
  mrl_engine *plain = new_engine();
  mrl_model *pm;
  mrl_kv_cache *pc = sweep_cache(plain, &pm, t);
  MUST(mrl_kv_cache_append(pc, 2, slots, t + 3, counts));
  slot_state want = state_of(pc);

  counting_alloc ca;
  mrl_engine *e = new_counting_engine(&ca);
  mrl_model *m;
  mrl_kv_cache *c = sweep_cache(e, &m, t);
  slot_state before = state_of(c);
  long k, failures = 0;
  for (k = 0; k < 200; k++) {
    size_t used = mrl_engine_memory_used(e);
    mrl_engine_clear_error(e);
    counting_alloc_arm(&ca, k);
    mrl_status st = mrl_kv_cache_append(c, 2, slots, t + 3, counts);
    counting_alloc_arm(&ca, -1);
    if (st == MRL_OK) break;
    failures++;
    slot_state now = state_of(c);
    CHECKF(st == MRL_ERR_NOMEM && strstr(mrl_engine_last_error(e), "allocate"),
           "request %ld failing: status %d, message \"%s\"", k, st, mrl_engine_last_error(e));
    CHECKF(memcmp(&now, &before, sizeof now) == 0, "request %ld failing: the slots changed", k);
    CHECKF(mrl_engine_memory_used(e) == used, "request %ld failing: memory %zu -> %zu", k, used,
           mrl_engine_memory_used(e));
  }
  slot_state got = state_of(c);
  CHECKF(k < 200 && failures >= 4, "%ld failing appends", failures);
  check_note("an append of 2 runs makes %ld allocations; failing each left the cache as it was",
             failures);
  CHECK(memcmp(&got, &want, sizeof got) == 0);
  mrl_kv_cache_free(c);
  mrl_model_free(m);
  mrl_engine_free(e);
  CHECKF(ca.live == 0 && ca.bad_frees == 0, "%ld blocks live, %ld bad frees", ca.live,
         ca.bad_frees);
  mrl_kv_cache_free(pc);
  mrl_model_free(pm);
  mrl_engine_free(plain);
}

/* Sampling that fails at any allocation (the workers, their scratch) draws nothing: the streams
 * are as they were, so the call that then succeeds draws what a call that never failed draws. */
static void test_sample_allocation_failures(void) {
  int32_t t[3 + 6 + 5];
  tokens_of(t, 14, 32);
  int slots[3] = {2, 0, 1}, counts[2] = {6, 5};
  mrl_sampling s = {.temperature = 1.0f, .top_k = 9, .top_p = 0.9f};
  mrl_engine *plain = new_engine();
  mrl_model *pm;
  mrl_kv_cache *pc = sweep_cache(plain, &pm, t);
  MUST(mrl_kv_cache_append(pc, 2, slots + 1, t + 3, counts));
  MUST(mrl_kv_cache_copy(pc, 0, 2, 99));
  int32_t want[3];
  float want_lp[3];
  MUST(mrl_kv_cache_sample(pc, 3, slots, &s, want, want_lp));

  counting_alloc ca;
  mrl_engine *e = new_counting_engine(&ca);
  mrl_model *m;
  mrl_kv_cache *c = sweep_cache(e, &m, t);
  MUST(mrl_kv_cache_append(c, 2, slots + 1, t + 3, counts));
  MUST(mrl_kv_cache_copy(c, 0, 2, 99));
  MUST(mrl_engine_set_threads(e, 2)); /* joins the workers the append started */
  MUST(mrl_engine_set_threads(e, 3));
  long k, failures = 0;
  int32_t got[3];
  float got_lp[3];
  for (k = 0; k < 100; k++) {
    size_t used = mrl_engine_memory_used(e);
    for (int i = 0; i < 3; i++) {
      got[i] = -7;
      got_lp[i] = 7.0f;
    }
    counting_alloc_arm(&ca, k);
    mrl_status st = mrl_kv_cache_sample(c, 3, slots, &s, got, got_lp);
    counting_alloc_arm(&ca, -1);
    if (st == MRL_OK) break;
    failures++;
    CHECKF(st == MRL_ERR_NOMEM && strstr(mrl_engine_last_error(e), "allocate"),
           "request %ld failing: status %d, message \"%s\"", k, st, mrl_engine_last_error(e));
    CHECKF(got[0] == -7 && got_lp[2] == 7.0f, "request %ld failing: outputs written", k);
    CHECKF(mrl_engine_memory_used(e) == used, "request %ld failing: memory %zu -> %zu", k, used,
           mrl_engine_memory_used(e));
  }
  CHECKF(k < 100 && failures >= 3, "%ld failing samples", failures);
  CHECK(memcmp(got, want, sizeof got) == 0 && memcmp(got_lp, want_lp, sizeof got_lp) == 0);
  mrl_kv_cache_free(c);
  mrl_model_free(m);
  mrl_engine_free(e);
  CHECKF(ca.live == 0 && ca.bad_frees == 0, "%ld blocks live, %ld bad frees", ca.live,
         ca.bad_frees);
  mrl_kv_cache_free(pc);
  mrl_model_free(pm);
  mrl_engine_free(plain);
}

/* NaN in the weights: sampling refuses the slots whose logits are not finite, with a message,
 * writes nothing and advances no stream (it used to hand NaNs to qsort, whose comparison then
 * did not order them); the slots with finite logits still sample. */
static void test_nan_weights_fail_sampling(void) {
  mrl_engine *e = new_engine();
  MUST(mrl_engine_set_threads(e, 2));
  e->pool_min_work = 0;
  mrl_model *m = make_model("qwen2", e, 6);
  mrl_kv_cache *c = NULL, *fresh = NULL;
  MUST(mrl_kv_cache_new(m, 3, CTX, &c));
  MUST(mrl_kv_cache_new(m, 2, CTX, &fresh));
  int32_t t[4];
  tokens_of(t, 4, 3);
  int slots[2] = {0, 1}, four = 4, two = 2, one = 1;
  /* slot 1 of both caches: finite logits and the same stream; slot 2 of c warms its scratch */
  MUST(mrl_kv_cache_append(c, 1, &slots[1], t, &two));
  MUST(mrl_kv_cache_append(fresh, 1, &slots[1], t, &two));
  MUST(mrl_kv_cache_copy(c, 1, 2, 5));
  mrl_sampling modes[4] = {{.temperature = 1.0f},
                           {.temperature = 0.0f},
                           {.temperature = 0.8f, .top_k = 5},
                           {.temperature = 0.8f, .top_p = 0.7f, .min_p = 0.1f}};
  int slot2 = 2;
  int32_t tok[2] = {-1, -1};
  MUST(mrl_kv_cache_sample(c, 1, &slot2, &modes[3], tok, NULL));
  /* slot 0: NaN everywhere */
  int w = mrl__model_find_param(m, "model.layers.1.self_attn.v_proj.weight");
  CHECK(w >= 0);
  float saved = m->weights[m->params[w].offset + 3];
  m->weights[m->params[w].offset + 3] = NAN;
  MUST(mrl_kv_cache_append(c, 1, &slots[0], t, &four));
  m->weights[m->params[w].offset + 3] = saved;
  const float *z = mrl_kv_cache_logits(c, 0);
  CHECK(z && isnan(z[0]));
  for (int i = 0; i < 4; i++) {
    float lp[2] = {1.0f, 1.0f};
    tok[0] = tok[1] = -1;
    CHECK_FAILS(e, MRL_ERR_INVALID, "slot 0: logit 0 is NaN",
                mrl_kv_cache_sample(c, 2, slots, &modes[i], tok, lp));
    CHECK(tok[0] == -1 && tok[1] == -1 && lp[1] == 1.0f);
  }
  /* slot 1 drew nothing in the failed calls: it draws what the same stream in `fresh` draws */
  int32_t a[3], b[3];
  float la[3], lb[3];
  for (int k = 0; k < 3; k++) {
    MUST(mrl_kv_cache_sample(c, 1, &slots[1], &modes[k == 1 ? 2 : 3], &a[k], &la[k]));
    MUST(mrl_kv_cache_sample(fresh, 1, &slots[1], &modes[k == 1 ? 2 : 3], &b[k], &lb[k]));
  }
  CHECK(memcmp(a, b, sizeof a) == 0 && memcmp(la, lb, sizeof la) == 0);
  /* infinite logits are refused too */
  float *finite = (float *)mrl_kv_cache_logits(c, 2);
  finite[7] = INFINITY;
  CHECK_FAILS(e, MRL_ERR_INVALID, "slot 2: logit 7 is infinite",
              mrl_kv_cache_sample(c, 1, &slot2, &modes[0], tok, NULL));
  /* appending to the NaN slot and sampling elsewhere still works */
  MUST(mrl_kv_cache_append(c, 1, &slots[0], t, &one));
  mrl_kv_cache_free(fresh);
  mrl_kv_cache_free(c);
  mrl_model_free(m);
  mrl_engine_free(e);
}

static void test_sample_duplicate_slots(void) {
  mrl_engine *e = new_engine();
  mrl_model *m = make_model("llama", e, 2);
  mrl_kv_cache *c = NULL;
  MUST(mrl_kv_cache_new(m, 2, CTX, &c));
  int32_t t[2] = {1, 2};
  int slot = 1, two = 2, twice[2] = {1, 1};
  MUST(mrl_kv_cache_append(c, 1, &slot, t, &two));
  mrl_sampling s = {.temperature = 1.0f};
  int32_t tok[2];
  CHECK_FAILS(e, MRL_ERR_INVALID, "slot 1 is listed twice",
              mrl_kv_cache_sample(c, 2, twice, &s, tok, NULL));
  mrl_kv_cache_free(c);
  mrl_model_free(m);
  mrl_engine_free(e);
}

static const test_case tests[] = {
    {"copy_slot", test_copy_slot},
    {"truncate", test_truncate},
    {"batch_invariant_appends", test_batch_invariant_appends},
    {"matches_forward_llama", test_matches_forward_llama},
    {"matches_forward_qwen2", test_matches_forward_qwen2},
    {"matches_forward_qwen3", test_matches_forward_qwen3},
    {"ragged_batch", test_ragged_batch},
    {"seeded_sampling_independent_of_batch", test_seeded_sampling_independent_of_batch},
    {"sampling_distributions", test_sampling_distributions},
    {"errors", test_errors},
    {"append_allocation_failures", test_append_allocation_failures},
    {"sample_allocation_failures", test_sample_allocation_failures},
    {"nan_weights_fail_sampling", test_nan_weights_fail_sampling},
    {"sample_duplicate_slots", test_sample_duplicate_slots},
    {"sample_masked", test_sample_masked},
    {NULL, NULL}};

int main(int argc, char **argv) { return check_main(argc, argv, tests); }
