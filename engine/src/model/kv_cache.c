/* kv_cache.c - incremental decoding: a key/value cache for many sequences, batched appends of
 * ragged token runs (prompts, sampled tokens, observations) through the decoder blocks of
 * block.c, and sampling (temperature, top-k, top-p, min-p, greedy) with one random stream per
 * sequence. */
#include "model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct mrl_kv_cache {
  mrl_model *model;
  int slots, capacity;
  float *keys, *values;  /* layers x slots x capacity x kv_dim each */
  int *length;           /* tokens held per slot */
  bool *has_logits;      /* the slot's logits are those after its last token */
  float *logits;         /* slots x vocab */
  struct mrl_rng *rng;   /* one stream per slot */
  mrl_block_seq *seq;    /* slots: the runs of an append, as the block sees them */
  /* per-append scratch, grown to the largest append */
  int64_t rows_cap;
  float *x, *xn, *qkv, *attn, *gate_up, *hidden, *scores;
  int64_t scores_cap;
  /* sampling scratch: vocab-sized */
  float *probs;
  struct candidate *order;
};

/* A token and its (unnormalised) probability, for sorting candidates. */
struct candidate {
  float p;
  int32_t id;
};

static int64_t cache_floats(const mrl_kv_cache *c) {
  const mrl_model *m = c->model;
  return (int64_t)m->cfg.layers * c->slots * c->capacity * m->kv_dim;
}

/* The per-append buffers, for R rows (and scores for the cache's capacity). */
typedef struct {
  float *x, *xn, *qkv, *attn, *gate_up, *hidden, *scores;
} row_buffers;

static void free_row_buffers(mrl_kv_cache *c, row_buffers *b, int64_t R, int64_t scores) {
  mrl_engine *e = c->model->engine;
  const mrl_model *m = c->model;
  int64_t qkv_w = m->q_dim + 2 * (int64_t)m->kv_dim;
  mrl__free(e, b->x, sizeof(float) * (size_t)(R * m->cfg.dim));
  mrl__free(e, b->xn, sizeof(float) * (size_t)(R * m->cfg.dim));
  mrl__free(e, b->qkv, sizeof(float) * (size_t)(R * qkv_w));
  mrl__free(e, b->attn, sizeof(float) * (size_t)(R * m->q_dim));
  mrl__free(e, b->gate_up, sizeof(float) * (size_t)(R * 2 * m->cfg.ffn));
  mrl__free(e, b->hidden, sizeof(float) * (size_t)(R * m->cfg.ffn));
  mrl__free(e, b->scores, sizeof(float) * (size_t)scores);
  memset(b, 0, sizeof *b);
}

/* New buffers for R rows in b, not yet the cache's (install_rows makes them so); b stays empty
 * when the cache has room already. False when out of memory (then nothing is held). */
static bool alloc_rows(mrl_kv_cache *c, int64_t R, row_buffers *b) {
  memset(b, 0, sizeof *b);
  if (R <= c->rows_cap) return true;
  mrl_engine *e = c->model->engine;
  const mrl_model *m = c->model;
  int64_t qkv_w = m->q_dim + 2 * (int64_t)m->kv_dim, scores = (int64_t)c->capacity * c->capacity;
  bool ok = (b->x = mrl__alloc(e, sizeof(float) * (size_t)(R * m->cfg.dim))) &&
            (b->xn = mrl__alloc(e, sizeof(float) * (size_t)(R * m->cfg.dim))) &&
            (b->qkv = mrl__alloc(e, sizeof(float) * (size_t)(R * qkv_w))) &&
            (b->attn = mrl__alloc(e, sizeof(float) * (size_t)(R * m->q_dim))) &&
            (b->gate_up = mrl__alloc(e, sizeof(float) * (size_t)(R * 2 * m->cfg.ffn))) &&
            (b->hidden = mrl__alloc(e, sizeof(float) * (size_t)(R * m->cfg.ffn))) &&
            (b->scores = mrl__alloc(e, sizeof(float) * (size_t)scores));
  if (!ok) free_row_buffers(c, b, R, scores);
  return ok;
}

/* The cache's buffers for the current rows_cap. */
static row_buffers current_rows(const mrl_kv_cache *c) {
  return (row_buffers){c->x, c->xn, c->qkv, c->attn, c->gate_up, c->hidden, c->scores};
}

/* Replaces the cache's buffers by those of alloc_rows (for R rows), if it made any. */
static void install_rows(mrl_kv_cache *c, int64_t R, row_buffers *b) {
  if (!b->x) return;
  row_buffers old = current_rows(c);
  free_row_buffers(c, &old, c->rows_cap, c->scores_cap);
  c->x = b->x;
  c->xn = b->xn;
  c->qkv = b->qkv;
  c->attn = b->attn;
  c->gate_up = b->gate_up;
  c->hidden = b->hidden;
  c->scores = b->scores;
  c->rows_cap = R;
  c->scores_cap = (int64_t)c->capacity * c->capacity;
}

void mrl_kv_cache_free(mrl_kv_cache *c) {
  if (!c) return;
  mrl_engine *e = c->model->engine;
  int64_t V = c->model->cfg.vocab;
  row_buffers rows = current_rows(c);
  free_row_buffers(c, &rows, c->rows_cap, c->scores_cap);
  mrl__free(e, c->keys, sizeof(float) * (size_t)cache_floats(c));
  mrl__free(e, c->values, sizeof(float) * (size_t)cache_floats(c));
  mrl__free(e, c->length, sizeof(int) * (size_t)c->slots);
  mrl__free(e, c->has_logits, sizeof(bool) * (size_t)c->slots);
  mrl__free(e, c->logits, sizeof(float) * (size_t)(c->slots * V));
  mrl__free(e, c->rng, sizeof(struct mrl_rng) * (size_t)c->slots);
  mrl__free(e, c->seq, sizeof(mrl_block_seq) * (size_t)c->slots);
  mrl__free(e, c->probs, sizeof(float) * (size_t)V);
  mrl__free(e, c->order, sizeof(struct candidate) * (size_t)V);
  mrl__free(e, c, sizeof *c);
}

mrl_status mrl_kv_cache_new(mrl_model *m, int slots, int capacity, mrl_kv_cache **out) {
  const char *fn = "mrl_kv_cache_new";
  if (!m) return MRL_ERR_NULL;
  mrl_engine *e = m->engine;
  if (!out) return mrl__fail(e, MRL_ERR_NULL, fn, "out is NULL");
  if (slots <= 0 || capacity <= 0 || capacity > m->cfg.ctx)
    return mrl__fail(e, MRL_ERR_INVALID, fn,
                     "need slots > 0 and 0 < capacity <= ctx (%d), got %d and %d", m->cfg.ctx,
                     slots, capacity);
  double floats = (double)m->cfg.layers * slots * capacity * m->kv_dim;
  if (floats * 2 * sizeof(float) > (double)SIZE_MAX / 4)
    return mrl__fail(e, MRL_ERR_OVERFLOW, fn, "cache too large");
  mrl_kv_cache *c = mrl__alloc(e, sizeof *c);
  if (!c) return mrl__fail(e, MRL_ERR_NOMEM, fn, "cannot allocate a cache");
  memset(c, 0, sizeof *c);
  c->model = m;
  c->slots = slots;
  c->capacity = capacity;
  int64_t V = m->cfg.vocab;
  c->keys = mrl__alloc(e, sizeof(float) * (size_t)cache_floats(c));
  c->values = mrl__alloc(e, sizeof(float) * (size_t)cache_floats(c));
  c->length = mrl__alloc(e, sizeof(int) * (size_t)slots);
  c->has_logits = mrl__alloc(e, sizeof(bool) * (size_t)slots);
  c->logits = mrl__alloc(e, sizeof(float) * (size_t)(slots * V));
  c->rng = mrl__alloc(e, sizeof(struct mrl_rng) * (size_t)slots);
  c->seq = mrl__alloc(e, sizeof(mrl_block_seq) * (size_t)slots);
  c->probs = mrl__alloc(e, sizeof(float) * (size_t)V);
  c->order = mrl__alloc(e, sizeof(struct candidate) * (size_t)V);
  if (!c->keys || !c->values || !c->length || !c->has_logits || !c->logits || !c->rng ||
      !c->seq || !c->probs || !c->order) {
    mrl_kv_cache_free(c);
    return mrl__fail(e, MRL_ERR_NOMEM, fn, "cannot allocate a cache of %d x %d tokens", slots,
                     capacity);
  }
  for (int s = 0; s < slots; s++) {
    c->length[s] = 0;
    c->has_logits[s] = false;
    mrl__rng_seed(&c->rng[s], (uint64_t)s);
  }
  *out = c;
  return MRL_OK;
}

static mrl_status check_slot(const mrl_kv_cache *c, const char *fn, int slot) {
  if (slot < 0 || slot >= c->slots)
    return mrl__fail(c->model->engine, MRL_ERR_RANGE, fn, "slot %d is outside 0..%d", slot,
                     c->slots - 1);
  return MRL_OK;
}

mrl_status mrl_kv_cache_reset(mrl_kv_cache *c, int slot, uint64_t seed) {
  if (!c) return MRL_ERR_NULL;
  mrl_status st = check_slot(c, "mrl_kv_cache_reset", slot);
  if (st) return st;
  c->length[slot] = 0;
  c->has_logits[slot] = false;
  mrl__rng_seed(&c->rng[slot], seed);
  return MRL_OK;
}

int mrl_kv_cache_length(const mrl_kv_cache *c, int slot) {
  if (!c || slot < 0 || slot >= c->slots) return -1;
  return c->length[slot];
}

const float *mrl_kv_cache_logits(const mrl_kv_cache *c, int slot) {
  if (!c || slot < 0 || slot >= c->slots || !c->has_logits[slot]) return NULL;
  return c->logits + (int64_t)slot * c->model->cfg.vocab;
}

/* The key (or value) row of a layer, slot and position in the cache. */
static float *cache_row(const mrl_kv_cache *c, float *base, int layer, int slot, int pos) {
  return base + (((int64_t)layer * c->slots + slot) * c->capacity + pos) * c->model->kv_dim;
}

mrl_status mrl_kv_cache_copy(mrl_kv_cache *c, int src, int dst, uint64_t seed) {
  const char *fn = "mrl_kv_cache_copy";
  if (!c) return MRL_ERR_NULL;
  mrl_status st = check_slot(c, fn, src);
  if (st || (st = check_slot(c, fn, dst))) return st;
  if (src == dst) return mrl__fail(c->model->engine, MRL_ERR_INVALID, fn, "src and dst are the same");
  size_t row = sizeof(float) * (size_t)c->model->kv_dim * (size_t)c->length[src];
  for (int l = 0; l < c->model->cfg.layers; l++) {
    memcpy(cache_row(c, c->keys, l, dst, 0), cache_row(c, c->keys, l, src, 0), row);
    memcpy(cache_row(c, c->values, l, dst, 0), cache_row(c, c->values, l, src, 0), row);
  }
  int64_t V = c->model->cfg.vocab;
  memcpy(c->logits + (int64_t)dst * V, c->logits + (int64_t)src * V, sizeof(float) * (size_t)V);
  c->length[dst] = c->length[src];
  c->has_logits[dst] = c->has_logits[src];
  mrl__rng_seed(&c->rng[dst], seed);
  return MRL_OK;
}

mrl_status mrl_kv_cache_append(mrl_kv_cache *c, int n, const int *slots, const int32_t *tokens,
                               const int *counts) {
  const char *fn = "mrl_kv_cache_append";
  if (!c) return MRL_ERR_NULL;
  mrl_model *m = c->model;
  mrl_engine *e = m->engine;
  if (n < 0) return mrl__fail(e, MRL_ERR_INVALID, fn, "n is negative");
  if (n == 0) return MRL_OK;
  if (!slots || !tokens || !counts)
    return mrl__fail(e, MRL_ERR_NULL, fn, "%s is NULL",
                     !slots ? "slots" : !tokens ? "tokens" : "counts");
  const mrl_model_config *cfg = &m->cfg;
  int64_t R = 0;
  for (int i = 0; i < n; i++) {
    mrl_status st = check_slot(c, fn, slots[i]);
    if (st) return st;
    if (counts[i] <= 0)
      return mrl__fail(e, MRL_ERR_INVALID, fn, "counts[%d] = %d must be positive", i, counts[i]);
    for (int j = 0; j < i; j++)
      if (slots[j] == slots[i])
        return mrl__fail(e, MRL_ERR_INVALID, fn, "slot %d is listed twice", slots[i]);
    if (counts[i] > c->capacity - c->length[slots[i]])
      return mrl__fail(e, MRL_ERR_RANGE, fn, "slot %d would hold %d tokens, capacity %d",
                       slots[i], c->length[slots[i]] + counts[i], c->capacity);
    for (int k = 0; k < counts[i]; k++)
      if (tokens[R + k] < 0 || tokens[R + k] >= cfg->vocab)
        return mrl__fail(e, MRL_ERR_RANGE, fn, "token %d is outside 0..%d", tokens[R + k],
                         cfg->vocab - 1);
    R += counts[i];
  }
  /* every step that can fail, before the cache changes (the rows, then the logits) */
  int64_t V = cfg->vocab;
  row_buffers fresh;
  if (!alloc_rows(c, R, &fresh))
    return mrl__fail(e, MRL_ERR_NOMEM, fn, "cannot allocate %lld rows", (long long)R);
  float *block = mrl__model_scratch(m, SCRATCH_HEAD, (int64_t)n * V);
  if (!block) {
    free_row_buffers(c, &fresh, R, (int64_t)c->capacity * c->capacity);
    return mrl__fail(e, MRL_ERR_NOMEM, fn, "cannot allocate logits");
  }
  install_rows(c, R, &fresh);
  int64_t D = cfg->dim;
  const float *W = m->weights;
  for (int i = 0, r = 0; i < n; r += counts[i], i++) {
    c->seq[i] = (mrl_block_seq){.row = r, .rows = counts[i], .len = counts[i],
                                .pos = c->length[slots[i]]};
    for (int k = 0; k < counts[i]; k++)
      memcpy(c->x + (int64_t)(r + k) * D, W + m->embed + (int64_t)tokens[r + k] * D,
             sizeof(float) * (size_t)D);
  }
  mrl_block_io io = {.rows = R, .nseq = n, .seq = c->seq, .x = c->x, .x_mid = c->x,
                     .x_out = c->x, .xn = c->xn, .qkv = c->qkv, .attn = c->attn,
                     .gate_up = c->gate_up, .hidden = c->hidden, .work = c->scores};
  for (int l = 0; l < cfg->layers; l++) {
    for (int i = 0; i < n; i++) {
      c->seq[i].k = cache_row(c, c->keys, l, slots[i], 0);
      c->seq[i].v = cache_row(c, c->values, l, slots[i], 0);
    }
    mrl__block_forward(m, l, &io);
  }
  /* logits after the last token of each run: the final norm of those rows into xn, one product
   * for all runs, then each slot's row into place */
  for (int i = 0, r = 0; i < n; i++) {
    r += counts[i];
    mrl__rmsnorm(c->xn + (int64_t)i * D, NULL, c->x + (int64_t)(r - 1) * D, W + m->final_norm, 1,
                 D, cfg->norm_eps);
  }
  mrl__gemm(false, true, n, V, D, 1.0f, c->xn, D, W + m->lm_head, D, 0.0f, block, V);
  for (int i = 0; i < n; i++) {
    memcpy(c->logits + (int64_t)slots[i] * V, block + (int64_t)i * V, sizeof(float) * (size_t)V);
    c->length[slots[i]] += counts[i];
    c->has_logits[slots[i]] = true;
  }
  return MRL_OK;
}

/* ---- sampling ---- */

static int by_prob_desc(const void *a, const void *b) {
  const struct candidate *x = a, *y = b;
  if (x->p != y->p) return x->p < y->p ? 1 : -1;
  return x->id < y->id ? -1 : 1; /* ties: lower id first, as the greedy choice */
}

/* Draws one token from logits z (vocab V) and returns it; *logp gets its log-probability under
 * the temperature-scaled distribution (temperature 1 when greedy). */
static int32_t sample_one(mrl_kv_cache *c, const float *z, int64_t V, const mrl_sampling *s,
                          struct mrl_rng *rng, float *logp) {
  float temp = s->temperature > 0.0f ? s->temperature : 1.0f;
  float mx = z[0];
  int32_t best = 0;
  for (int64_t j = 1; j < V; j++)
    if (z[j] > mx) {
      mx = z[j];
      best = (int32_t)j;
    }
  double sum = 0.0;
  float *p = c->probs;
  for (int64_t j = 0; j < V; j++) {
    p[j] = expf((z[j] - mx) / temp);
    sum += p[j];
  }
  float log_sum = (float)log(sum);
  if (s->temperature <= 0.0f) {
    *logp = -log_sum; /* z[best] == mx */
    return best;
  }
  /* candidates in descending probability, cut by top-k, top-p and min-p */
  int64_t n = V;
  struct candidate *order = c->order;
  for (int64_t j = 0; j < V; j++) order[j] = (struct candidate){p[j], (int32_t)j};
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
  float floor_p = s->min_p > 0.0f ? s->min_p * p[best] : 0.0f;
  double kept = 0.0;
  for (int64_t k = 0; k < n; k++)
    if (order[k].p >= floor_p) kept += order[k].p;
  double u = mrl__rng_uniform(rng) * kept, acc = 0.0;
  int32_t pick = best;
  for (int64_t k = 0; k < n; k++) {
    if (order[k].p < floor_p) continue;
    pick = order[k].id;
    acc += order[k].p;
    if (u < acc) break;
  }
  *logp = (z[pick] - mx) / temp - log_sum;
  return pick;
}

mrl_status mrl_kv_cache_sample(mrl_kv_cache *c, int n, const int *slots,
                               const mrl_sampling *sampling, int32_t *tokens, float *logprobs) {
  const char *fn = "mrl_kv_cache_sample";
  if (!c) return MRL_ERR_NULL;
  mrl_engine *e = c->model->engine;
  if (n < 0) return mrl__fail(e, MRL_ERR_INVALID, fn, "n is negative");
  if (n > 0 && (!slots || !sampling || !tokens))
    return mrl__fail(e, MRL_ERR_NULL, fn, "%s is NULL",
                     !slots ? "slots" : !sampling ? "sampling" : "tokens");
  if (n > 0 && (!(sampling->temperature >= 0.0f) || sampling->top_k < 0 ||
                !(sampling->top_p >= 0.0f && sampling->top_p <= 1.0f) ||
                !(sampling->min_p >= 0.0f && sampling->min_p <= 1.0f)))
    return mrl__fail(e, MRL_ERR_INVALID, fn,
                     "need temperature >= 0, top_k >= 0, top_p and min_p in [0, 1]");
  for (int i = 0; i < n; i++) {
    mrl_status st = check_slot(c, fn, slots[i]);
    if (st) return st;
    if (!c->has_logits[slots[i]])
      return mrl__fail(e, MRL_ERR_INVALID, fn, "slot %d has no tokens to continue from",
                       slots[i]);
  }
  int64_t V = c->model->cfg.vocab;
  /* logits that are not finite have no distribution to draw from (and the comparisons of the
   * sort would not order them): refused before any slot draws */
  for (int i = 0; i < n; i++) {
    const float *z = c->logits + (int64_t)slots[i] * V;
    for (int64_t j = 0; j < V; j++)
      if (!isfinite(z[j]))
        return mrl__fail(e, MRL_ERR_INVALID, fn,
                         "slot %d: logit %lld is %s; the model's outputs are not finite (NaN or "
                         "infinite weights or activations)",
                         slots[i], (long long)j, isnan(z[j]) ? "NaN" : "infinite");
  }
  for (int i = 0; i < n; i++) {
    float lp;
    tokens[i] = sample_one(c, c->logits + (int64_t)slots[i] * V, V, sampling, &c->rng[slots[i]],
                           &lp);
    if (logprobs) logprobs[i] = lp;
  }
  return MRL_OK;
}
