/* test_threads.c - the engine's own threads: one training step and a stretch of KV-cache sampling
 * give the same bits on 1, 2 and 3 threads; two engines used from two pthreads at once give the
 * same bits as each used alone; the workers start when needed and go with the engine. */
#include "model.h"
#include "support.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum { V = 41, B = 5, T = 44, SLOTS = 6, CAP = 64, DRAWS = 12 };

/* Everything one run computes. */
typedef struct {
  float logits[B * T * V];
  float *grads, *weights; /* numel each: after backward, after the AdamW step */
  int64_t numel;
  int32_t drawn[DRAWS * SLOTS];
  float drawn_logp[DRAWS * SLOTS];
  float last_logits[SLOTS * V];
  bool pool_started; /* the work reached the workers */
} outcome;

typedef struct {
  int threads;
  uint64_t seed;
  outcome out;
} run_args;

static void run(run_args *a) {
  outcome *o = &a->out;
  mrl_engine *e = NULL;
  MUST(mrl_engine_new(&e));
  MUST(mrl_engine_set_threads(e, a->threads));
  e->pool_min_work = 0; /* every job of more than one unit goes to the workers */
  mrl_model_config c;
  mrl_model_config_default(&c);
  c.vocab = V;
  c.dim = 32;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn = 40;
  c.ctx = CAP;
  c.qk_norm = 1;
  mrl_model *m = NULL;
  MUST(mrl_model_new(e, &c, a->seed, &m));
  struct mrl_rng r;
  mrl__rng_seed(&r, a->seed + 1);
  for (int64_t i = 0; i < m->numel; i++) m->weights[i] += (float)(0.2 * mrl__rng_normal(&r));

  int32_t tokens[B * T], lengths[B] = {44, 17, 30, 1, 39}, targets[B * T];
  float dlogp[B * T], dent[B * T];
  for (int i = 0; i < B * T; i++) {
    tokens[i] = (int32_t)(mrl__rng_u64(&r) % V);
    dlogp[i] = (float)mrl__rng_normal(&r);
    dent[i] = (float)(0.3 * mrl__rng_normal(&r));
  }
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      targets[b * T + t] = t + 1 < lengths[b] ? tokens[b * T + t + 1] : -1;
  MUST(mrl_model_forward(m, tokens, lengths, B, T));
  mrl_tensor *z = NULL;
  MUST(mrl_model_logits(m, &z));
  memcpy(o->logits, mrl_tensor_data(z), sizeof o->logits);
  mrl_tensor_free(z);
  MUST(mrl_model_zero_grad(m));
  MUST(mrl_model_backward(m, targets, dlogp, dent));
  o->numel = m->numel;
  o->grads = malloc(sizeof(float) * (size_t)m->numel);
  o->weights = malloc(sizeof(float) * (size_t)m->numel);
  memcpy(o->grads, m->grads, sizeof(float) * (size_t)m->numel);
  mrl_adamw opt = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.1f};
  MUST(mrl_model_adamw_step(m, &opt));
  memcpy(o->weights, m->weights, sizeof(float) * (size_t)m->numel);

  mrl_kv_cache *cache = NULL;
  MUST(mrl_kv_cache_new(m, SLOTS, CAP, &cache));
  int slots[SLOTS] = {4, 0, 5, 2, 1, 3}, counts[SLOTS] = {9, 20, 1, 14, 5, 30}, ones[SLOTS];
  for (int i = 0; i < SLOTS; i++) {
    MUST(mrl_kv_cache_reset(cache, i, a->seed * 10 + (uint64_t)i));
    ones[i] = 1;
  }
  MUST(mrl_kv_cache_append(cache, SLOTS, slots, tokens, counts));
  mrl_sampling s = {.temperature = 0.9f, .top_k = 20, .top_p = 0.95f, .min_p = 0.02f};
  for (int k = 0; k < DRAWS; k++) {
    int32_t *tok = o->drawn + k * SLOTS;
    MUST(mrl_kv_cache_sample(cache, SLOTS, slots, &s, tok, o->drawn_logp + k * SLOTS));
    MUST(mrl_kv_cache_append(cache, SLOTS, slots, tok, ones));
  }
  for (int i = 0; i < SLOTS; i++)
    memcpy(o->last_logits + i * V, mrl_kv_cache_logits(cache, i), sizeof(float) * V);
  o->pool_started = e->pool != NULL;
  mrl_kv_cache_free(cache);
  mrl_model_free(m);
  mrl_engine_free(e);
}

static void *run_thread(void *arg) {
  run(arg);
  return NULL;
}

/* The fields that must agree bit for bit; names the first that does not. */
static const char *first_difference(const outcome *a, const outcome *b) {
  if (memcmp(a->logits, b->logits, sizeof a->logits)) return "logits";
  if (a->numel != b->numel || memcmp(a->grads, b->grads, sizeof(float) * (size_t)a->numel))
    return "gradients";
  if (memcmp(a->weights, b->weights, sizeof(float) * (size_t)a->numel)) return "weights";
  if (memcmp(a->drawn, b->drawn, sizeof a->drawn)) return "sampled tokens";
  if (memcmp(a->drawn_logp, b->drawn_logp, sizeof a->drawn_logp)) return "sampled logprobs";
  if (memcmp(a->last_logits, b->last_logits, sizeof a->last_logits)) return "cache logits";
  return NULL;
}

static void release(outcome *o) {
  free(o->grads);
  free(o->weights);
}

static void test_thread_count_changes_no_bit(void) {
  static run_args runs[3];
  for (int i = 0; i < 3; i++) {
    runs[i] = (run_args){.threads = i + 1, .seed = 7};
    run(&runs[i]);
  }
  CHECK(!runs[0].out.pool_started && runs[1].out.pool_started && runs[2].out.pool_started);
  for (int i = 1; i < 3; i++) {
    const char *d = first_difference(&runs[0].out, &runs[i].out);
    CHECKF(d == NULL, "%d threads: %s differ from 1 thread", i + 1, d ? d : "");
  }
  /* and the runs did something: the samples are not all one token */
  int distinct = 0;
  for (int k = 1; k < DRAWS * SLOTS; k++) distinct += runs[0].out.drawn[k] != runs[0].out.drawn[0];
  CHECK(distinct > 0);
  for (int i = 0; i < 3; i++) release(&runs[i].out);
}

static void test_two_engines_in_two_threads(void) {
  static run_args alone[2], together[2];
  for (int i = 0; i < 2; i++) {
    alone[i] = (run_args){.threads = 2, .seed = 21 + (uint64_t)i};
    run(&alone[i]);
  }
  CHECK(first_difference(&alone[0].out, &alone[1].out) != NULL); /* different models */
  for (int round = 0; round < 3; round++) {
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
      together[i] = (run_args){.threads = 2, .seed = 21 + (uint64_t)i};
      CHECK(pthread_create(&th[i], NULL, run_thread, &together[i]) == 0);
    }
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 2; i++) {
      const char *d = first_difference(&alone[i].out, &together[i].out);
      CHECKF(d == NULL, "round %d, engine %d: %s differ from the engine used alone", round, i,
             d ? d : "");
      release(&together[i].out);
    }
  }
  for (int i = 0; i < 2; i++) release(&alone[i].out);
}

/* The workers start at the first call that needs them (not counted as the engine's memory) and
 * go with the engine, in whatever order its objects are freed; a new count takes effect. */
static void test_workers_lifetime(void) {
  counting_alloc c;
  mrl_engine *e = new_counting_engine(&c);
  MUST(mrl_engine_set_threads(e, 3));
  mrl_model_config cfg;
  mrl_model_config_default(&cfg);
  cfg.vocab = 11;
  cfg.dim = 16;
  cfg.layers = 1;
  cfg.ffn = 16;
  cfg.ctx = 16;
  mrl_model *m = NULL;
  MUST(mrl_model_new(e, &cfg, 1, &m));
  CHECK(e->pool == NULL);
  int32_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8}, len[2] = {4, 3};
  MUST(mrl_model_forward(m, tok, len, 2, 4));
  CHECK(e->pool != NULL);
  long with_pool = c.live;
  MUST(mrl_engine_set_threads(e, 2)); /* joins the three */
  CHECK(e->pool == NULL && c.live < with_pool);
  MUST(mrl_model_forward(m, tok, len, 2, 4));
  CHECK(e->pool != NULL);
  mrl_model_free(m);
  CHECK(mrl_engine_memory_used(e) == 0 && e->pool != NULL);
  mrl_engine_free(e);
  CHECKF(c.live == 0 && c.bad_frees == 0, "%ld blocks live, %ld bad frees", c.live, c.bad_frees);

  /* the engine freed first: its model keeps it, and its workers, until the model goes */
  e = new_counting_engine(&c);
  MUST(mrl_engine_set_threads(e, 2));
  MUST(mrl_model_new(e, &cfg, 1, &m));
  mrl_engine_free(e);
  MUST(mrl_model_forward(m, tok, len, 2, 4));
  CHECK(m->engine->pool != NULL);
  mrl_model_free(m);
  CHECKF(c.live == 0 && c.bad_frees == 0, "%ld blocks live, %ld bad frees", c.live, c.bad_frees);
}

static const test_case tests[] = {
    {"thread_count_changes_no_bit", test_thread_count_changes_no_bit},
    {"two_engines_in_two_threads", test_two_engines_in_two_threads},
    {"workers_lifetime", test_workers_lifetime},
    {NULL, NULL}};

int main(int argc, char **argv) { return check_main(argc, argv, tests); }
